#!/usr/bin/env bash
# The checks a GPU host owes issues 15 and 17 (docs/gpu.md), each part's log kept in
# OUT_DIR, so that a short lease of a GPU machine goes to running them, not to typing them:
#   host     host.txt: GPU, driver, PyTorch and CUDA versions, tide's build
#   tests    cuda-tests.log: the CUDA label, where a skip fails (TIDE_REQUIRE_CUDA=1)
#   demo     demo.log: the demo recipe trained on GPU 0 in bf16, then sampled
#   s1, s2   bench-S.log: bench/train_vs_pytorch.py --device cuda --precision bf16 on that
#            shape, and profile-S.txt: the summary of tide's profile of two more steps
# Parts run in the order given (default: host tests demo s1 s2); a failed part is logged
# and the next runs. Exit status: the number of failed parts.
# Usage: scripts/gpu_host_checks.sh [--build DIR] OUT_DIR [PART...]
#   --build DIR   tide's build folder (default: build), made against a CUDA PyTorch
set -uo pipefail
cd "$(dirname "$0")/.."
build=build
case "${1:-}" in
  -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  --build) build=${2:?--build needs a folder}; shift 2 ;;
esac
out=${1:?usage: scripts/gpu_host_checks.sh [--build DIR] OUT_DIR [PART...]}
shift
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(host tests demo s1 s2)
for part in "${parts[@]}"; do
  case $part in
    host|tests|demo|s1|s2|tiny|gpu) ;;
    *) echo "gpu_host_checks: unknown part '$part' (host, tests, demo, s1, s2, tiny, gpu)" >&2; exit 2 ;;
  esac
done
tide=$build/tools/tide
python=python3
[[ -x .venv/bin/python ]] && python=.venv/bin/python
if [[ ! -x $tide ]]; then
  echo "gpu_host_checks: no $tide; build tide first (docs/gpu.md)" >&2
  exit 2
fi
mkdir -p "$out"
export PYTHONUNBUFFERED=1

part_host() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
"cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name(0))'
  git log -1 --format='tide %h %cd' --date=iso 2>/dev/null || true
  nproc
}

part_tests() { (cd "$build" && TIDE_REQUIRE_CUDA=1 ctest -L cuda --output-on-failure --timeout 900); }

part_demo() {
  "$tide" train llama/llama-tiny --set device=cuda --set precision.compute=bf16 --run-dir "$out/run" &&
    "$tide" generate "$out/run" --device cuda --prompt "And God said" --max-tokens 120 --temperature 0.8 \
      --top-k 50 --seed 7
  local rc=$?
  rm -rf "$out/run"  # the log has what matters; the weights are not to be copied back
  return $rc
}

part_bench() {
  local shape=$1 profiles
  profiles=$(mktemp -d)
  "$python" bench/train_vs_pytorch.py --tide "$tide" --device cuda --precision bf16 --shape "$shape" \
    --profile-dir "$profiles"
  local rc=$?
  cat "$profiles"/*/*.summary.txt > "$out/profile-$shape.txt" 2>/dev/null
  rm -rf "$profiles"
  return $rc
}

failed=0
for part in "${parts[@]}"; do
  case $part in
    host) log=host.txt; cmd=(part_host) ;;
    tests) log=cuda-tests.log; cmd=(part_tests) ;;
    demo) log=demo.log; cmd=(part_demo) ;;
    *) log=bench-$part.log; cmd=(part_bench "$part") ;;
  esac
  start=$SECONDS
  "${cmd[@]}" > "$out/$log" 2>&1
  rc=$?
  echo "gpu_host_checks: $part: rc $rc in $((SECONDS - start)) s ($out/$log)"
  [[ $rc -eq 0 ]] || failed=$((failed + 1))
done
exit $failed
