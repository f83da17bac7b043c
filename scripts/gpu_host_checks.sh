#!/usr/bin/env bash
# The checks a GPU host owes issues 15 and 17 (docs/gpu.md), each part's log kept in
# OUT_DIR, so that a short lease of a GPU machine goes to running them, not to typing them.
# All parts together leave 8 files, the most the device tool brings back:
#   build    build.log: (with --kit) tide and its tests built against the host's PyTorch with
#            the carried libraries; later calls with --kit find that build's environment
#   host     host.txt: GPU, driver, PyTorch and CUDA versions, tide's build
#   binding  appended to host.txt: where the binaries' std-library symbols bind
#            (docs/building.md, "libstdc++ first"); where any binds into LibTorch, the link
#            line and toolchain
#   tests    cuda-tests.log: the CUDA label, where a skip fails (TIDE_REQUIRE_CUDA=1)
#   demo     demo.log: the demo recipe trained on GPU 0 in bf16, then sampled
#   s1, s2   bench-S.log: bench/train_vs_pytorch.py --device cuda --precision bf16 on that
#            shape, and profile-S.tar.gz: tide's profile of two more steps, captured and
#            uncaptured (each run's summary, and its Chrome trace gzipped where the archive
#            stays under 15 MiB)
#   window   bench-window.log and profile-window.tar.gz likewise, on the sliding-window shape
#            (not a default part: with all the defaults it would leave 10 files)
# Parts run in the order given (default: host binding tests demo s1 s2); a failed part is logged
# and the next runs. Exit status: the number of failed parts.
# Usage: scripts/gpu_host_checks.sh [--build DIR] [--kit DIR] OUT_DIR [PART...]
#   --build DIR   tide's build folder (default: build; build-gpu with --kit, where the
#                 kit's build puts it), made against a CUDA PyTorch
#   --kit DIR     for a host with no registries (docs/gpu.md, "A lease of a GPU machine"):
#                 DIR/kit holds ../shared/gpu's scripts and the Debian packages they unpack,
#                 DIR/whl the Python wheels the host lacks (pyzmq, for daemon.cuda)
set -uo pipefail
cd "$(dirname "$0")/.."
build=""
kit=""
usage="usage: scripts/gpu_host_checks.sh [--build DIR] [--kit DIR] OUT_DIR [PART...]"
while [[ $# -gt 0 ]]; do
  case $1 in
    -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --build) build=${2:?--build needs a folder}; shift 2 ;;
    --kit) kit=${2:?--kit needs a folder}; shift 2 ;;
    -*) echo "gpu_host_checks: unknown option '$1' ($usage)" >&2; exit 2 ;;
    *) break ;;
  esac
done
[[ -n $build ]] || { [[ -n $kit ]] && build=build-gpu || build=build; }
out=${1:?$usage}
shift
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(host binding tests demo s1 s2)
for part in "${parts[@]}"; do
  case $part in
    build) [[ -n $kit ]] || { echo "gpu_host_checks: the build part needs --kit" >&2; exit 2; } ;;
    host|binding|tests|demo|s1|s2|tiny|gpu|window) ;;
    *) echo "gpu_host_checks: unknown part '$part' (build, host, binding, tests, demo, s1, s2, tiny, gpu, window)" >&2; exit 2 ;;
  esac
done
if [[ -n $kit && ! -x $kit/kit/build-on-gpu-host.sh ]]; then
  echo "gpu_host_checks: --kit $kit has no kit/build-on-gpu-host.sh (docs/gpu.md)" >&2
  exit 2
fi
tide=$build/tools/tide
python=python3
[[ -x .venv/bin/python ]] && python=.venv/bin/python
mkdir -p "$out"
export PYTHONUNBUFFERED=1

# The kit's libraries are unpacked under /tmp/deb by its build; a later call (a new shell on
# the same machine) needs their runtime path and the wheels' folder again.
kit_site=/tmp/gpu_host_site
use_kit_environment() {
  [[ -r /tmp/deb/env.sh ]] && source /tmp/deb/env.sh
  [[ -d $kit_site ]] && export PYTHONPATH=$kit_site${PYTHONPATH:+:$PYTHONPATH}
  return 0
}
[[ -n $kit ]] && use_kit_environment

# Ninja's arguments: what the parts run, not the whole tree (a lease's minutes go to the
# GPU), and -k 0 so that a build that fails shows every error in one lease.
ninja_args=(-k 0 tide tided tide-worker libtide.so tide_engine_tests capi_run)
part_build() {
  if compgen -G "$kit/whl/*.whl" > /dev/null; then
    "$python" -m pip install -q --no-index --no-deps --no-compile --target "$kit_site" "$kit"/whl/*.whl || return
  fi
  # The kit's pkg-config, with its own library: CMake would otherwise find the kit's
  # pkgconf binary by the prefix path and run it without libpkgconf where the host has none.
  local wrapper=/tmp/deb-pkg-config
  printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/deb/usr/lib/x86_64-linux-gnu exec /tmp/deb/usr/bin/pkgconf "$@"\n' > "$wrapper"
  chmod +x "$wrapper"
  # libssl-dev keeps opensslconf.h under the multiarch folder, which only the host's own
  # /usr/include has on the compiler's search path.
  CPATH=/tmp/deb/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH} PKG_CONFIG=$wrapper \
    "$kit/kit/build-on-gpu-host.sh" "$kit/kit" "${ninja_args[@]}" || return
  [[ $build == build-gpu ]] || echo "gpu_host_checks: the kit builds into build-gpu; the parts use $build"
  use_kit_environment
}

require_tide() {
  [[ -x $tide ]] && return 0
  echo "gpu_host_checks: no $tide; build tide first (docs/gpu.md)"
  return 2
}

part_host() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  "$python" -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda,
"cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name(0))'
  git log -1 --format='tide %h %cd' --date=iso 2>/dev/null || true
  nproc
}

part_binding() {
  require_tide || return
  local binaries=("$tide" "$build/tools/tide-worker" "$build/capi/libtide.so" "$build/tests/tide_engine_tests")
  "$python" tests/tools/check_symbol_binding.py --ours "$build" "${binaries[@]}" && return 0
  local rc=$?
  echo "--- the link line of tide, and the toolchain that ran it"
  ninja -C "$build" -t commands tools/tide | tail -1
  c++ --version | head -1
  ld --version | head -1
  cmake --version | head -1
  readelf -d "$tide" | grep NEEDED
  echo "--- the environment's build variables"
  env | grep -E '^(CC|CXX|CFLAGS|CXXFLAGS|LDFLAGS|LIBRARY_PATH|LD_LIBRARY_PATH|LD_PRELOAD)=' || true
  grep -E '^CMAKE_(CXX_COMPILER|EXE_LINKER_FLAGS|SHARED_LINKER_FLAGS):' "$build/CMakeCache.txt"
  return $rc
}

# The CUDA tests share the one GPU (a few hundred MB each), a quarter of the cores at once.
part_tests() {
  require_tide &&
    (cd "$build" && TIDE_REQUIRE_CUDA=1 ctest -L cuda -j "$(( ($(nproc) + 3) / 4 ))" --output-on-failure --timeout 300)
}

part_demo() {
  require_tide || return
  # Outside OUT_DIR: the log has what matters, and a part stopped at the lease's limit
  # must not leave weights among the files that come back.
  local run
  run=$(mktemp -d /tmp/gpu-demo-XXXXXX)
  "$tide" train llama/llama-tiny --set device=cuda --set precision.compute=bf16 --run-dir "$run" &&
    "$tide" generate "$run" --device cuda --prompt "And God said" --max-tokens 120 --temperature 0.8 \
      --top-k 50 --seed 7
  local rc=$?
  rm -rf "$run"
  return $rc
}

part_bench() {
  local shape=$1 profiles
  require_tide || return
  profiles=$(mktemp -d)
  "$python" bench/train_vs_pytorch.py --tide "$tide" --device cuda --precision bf16 --shape "$shape" \
    --profile-dir "$profiles"
  local rc=$?
  # The summaries, and the traces (which kernel each operator launched, with its inputs'
  # shapes) where they fit the device tool's 16 MiB a file.
  gzip -q "$profiles"/*/*.trace.json 2>/dev/null
  local archive=$out/profile-$shape.tar.gz
  tar -czf "$archive" -C "$profiles" . 2>/dev/null
  if [[ $(stat -c %s "$archive" 2>/dev/null || echo 0) -gt $((15 << 20)) ]]; then
    echo "gpu_host_checks: the traces make profile-$shape.tar.gz too large; summaries only"
    tar -czf "$archive" -C "$profiles" --exclude='*.trace.json.gz' .
  fi
  rm -rf "$profiles"
  return $rc
}

failed=0
for part in "${parts[@]}"; do
  case $part in
    build) log=build.log; cmd=(part_build) ;;
    host) log=host.txt; cmd=(part_host) ;;
    binding) log=host.txt; cmd=(part_binding) ;;
    tests) log=cuda-tests.log; cmd=(part_tests) ;;
    demo) log=demo.log; cmd=(part_demo) ;;
    *) log=bench-$part.log; cmd=(part_bench "$part") ;;
  esac
  start=$SECONDS
  if [[ $part == binding ]]; then
    echo "--- binding" >> "$out/$log"
    "${cmd[@]}" >> "$out/$log" 2>&1
  else
    "${cmd[@]}" > "$out/$log" 2>&1
  fi
  rc=$?
  echo "gpu_host_checks: $part: rc $rc in $((SECONDS - start)) s ($out/$log)"
  [[ $rc -eq 0 ]] || failed=$((failed + 1))
done
exit $failed
