#!/usr/bin/env bash
# Checkpoints with real worker processes on CPU:
#  - save at step 5 of 10 and resume: steps 6-10 equal the uninterrupted run's exactly
#    (losses and final weights byte for byte) for one process, ZeRO-3 x2, tp2 and pp2;
#  - a checkpoint saved under dp2 x tp2 resumes as one process, as ZeRO-3 x4 and as pp2
#    with the uninterrupted run's losses within 1e-5;
#  - a flipped byte: `tide ckpt verify` names the file, --resume auto falls back;
#  - SIGKILL at random moments of a run that saves every step: the newest committed
#    checkpoint always verifies and resumes;
#  - a save that cannot be written: training goes on, the error is logged, older
#    checkpoints stay;
#  - export from a tp2 x pp2 checkpoint equals the export of the same run's weights.
source "$(dirname "$0")/common.sh" "$1"

resume_from_5() {  # resume_from_5 RECIPE FULL_RUN NEW_RUN [options]: steps 6-10 again from step 5
  local recipe=$1 full=$2 new=$3
  shift 3
  mkdir -p "$work/$new/checkpoints"
  cp -r "$work/$full/checkpoints/step-00000005" "$work/$new/checkpoints/"
  head -5 "$work/$full/metrics.jsonl" > "$work/$new/metrics.jsonl"
  train $recipe $new --resume "$work/$new/checkpoints/step-00000005" "$@"
  grep -q "resumed from" "$work/$new/train.log" || fail "$new did not resume"
}

echo "exact resume:"
for layout in "one:" "zero3:--nproc 2 --set parallel.zero=3" "tp2:--nproc 2 --set parallel.tp=2" \
              "pp2:--nproc 2 --set parallel.pp=2"; do
  name=${layout%%:*}
  read -r -a args <<< "${layout#*:}"
  shape=llama
  [[ $name == pp2 ]] && shape=bloom  # tied embeddings across the stages
  train $shape $shape-$name --set checkpoint.every=5 "${args[@]}"
  resume_from_5 $shape $shape-$name $shape-$name-resumed "${args[@]}"
  compare "$work/$shape-$name" "$work/$shape-$name-resumed" 1 || fail "$name: resumed run differs"
  cmp -s "$work/$shape-$name/model.safetensors" "$work/$shape-$name-resumed/model.safetensors" \
    || fail "$name: resumed weights differ"
done

echo "resharded resume (saved under dp2 x tp2):"
train bloom bloom-1
train bloom bloom-dp2-tp2 --set checkpoint.every=5 --nproc 4 --set parallel.tp=2
for layout in "one:" "zero3x4:--nproc 4 --set parallel.zero=3" "pp2:--nproc 2 --set parallel.pp=2"; do
  name=${layout%%:*}
  read -r -a args <<< "${layout#*:}"
  resume_from_5 bloom bloom-dp2-tp2 bloom-as-$name "${args[@]}"
  compare "$work/bloom-1" "$work/bloom-as-$name" 0 || fail "dp2 x tp2 checkpoint resumed as $name differs"
done

echo "corruption:"
cp -r "$work/llama-one" "$work/corrupt"
file="$work/corrupt/checkpoints/step-00000010/rank-00000.safetensors"
/usr/bin/python3 - "$file" <<'PY'
import os, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    f.seek(os.path.getsize(path) // 2)
    b = f.read(1)
    f.seek(-1, 1)
    f.write(bytes([b[0] ^ 0xFF]))
PY
if $tide ckpt verify "$work/corrupt/checkpoints/step-00000010" > "$work/log" 2>&1; then fail "verify passed a flipped byte"; fi
grep -q "rank-00000.safetensors: XXH3" "$work/log" || { cat "$work/log"; fail "verify does not name the corrupt file"; }
train llama corrupt --set checkpoint.every=5 --set schedule.steps=12 --resume auto
grep -q "step-00000010 is unusable" "$work/log" "$work/corrupt/train.log" || { cat "$work/log"; fail "no fallback reported"; }
grep -q "resumed from .*step-00000005" "$work/corrupt/train.log" || fail "did not fall back to step 5"
echo "  flipped byte named; resumed from step 5 instead"

echo "kill -9 during saves:"
# A wider model (3.3M parameters, 40 MB per checkpoint) saved after every step, so that
# a good share of the wall time is spent saving.
mid_save=0
for trial in 1 2 3 4 5 6 7 8; do
  rm -rf "$work/killed"
  mode=true
  (( trial % 2 == 0 )) && mode=false
  $tide train "$work/llama.lua" --run-dir "$work/killed" --quiet --set schedule.steps=100000 --set checkpoint.every=1 \
    --set checkpoint.keep_last=2 --set eval.every=0 --set checkpoint.async=$mode --set model.dim=256 \
    --set model.n_heads=4 --set model.n_kv_heads=2 --set model.n_layers=4 --set model.multiple_of=64 \
    2> "$work/killed.log" &
  launcher=$!
  sleep "$(/usr/bin/python3 -c "import random; print(round(random.uniform(1.5, 4.0), 2))")"
  kill -9 $launcher || { cat "$work/killed.log"; fail "trial $trial: the run ended before it was killed"; }
  wait $launcher 2> /dev/null || true
  launcher=
  compgen -G "$work/killed/checkpoints/*.tmp" > /dev/null && mid_save=$((mid_save + 1))
  newest=$( ($tide ckpt list "$work/killed" 2> /dev/null || true) | tail -1 | cut -d' ' -f1)
  if [[ -z $newest ]]; then echo "  trial $trial: killed before the first save"; continue; fi
  $tide ckpt verify "$newest" > /dev/null 2> "$work/log" || { cat "$work/log"; fail "trial $trial: $newest does not verify"; }
  train llama killed-resume --resume "$newest" --set schedule.steps=$(( $(basename "$newest" | sed 's/step-0*//') + 1 )) \
    --set model.dim=256 --set model.n_heads=4 --set model.n_kv_heads=2 --set model.n_layers=4 --set model.multiple_of=64
  echo "  trial $trial: killed after $(basename "$newest"), which verifies and resumes"
done

echo "  $mid_save of 8 kills landed in the middle of a save (a temporary left behind)"

echo "a save that cannot be written:"
train llama unwritable --set checkpoint.every=5 --set schedule.steps=5
touch "$work/unwritable/checkpoints/step-00000010.tmp"  # a file where the save needs a directory
train llama unwritable --set checkpoint.every=5 --resume auto
grep -q "checkpoint failed" "$work/unwritable/train.log" || fail "the failed save was not logged"
$tide ckpt verify "$work/unwritable/checkpoints/step-00000005" > /dev/null || fail "the older checkpoint was harmed"
[[ $(wc -l < "$work/unwritable/metrics.jsonl") -eq 10 ]] || fail "training did not go on after the failed save"
echo "  logged, training finished, step 5 intact"

echo "export:"
train bloom bloom-tp2-pp2 --set checkpoint.every=5 --nproc 4 --set parallel.tp=2 --set parallel.pp=2
$tide ckpt export "$work/bloom-tp2-pp2/checkpoints/step-00000010" --out "$work/export-ckpt" 2> /dev/null
$tide convert export "$work/bloom-tp2-pp2" --out "$work/export-weights" 2> /dev/null
cmp -s "$work/export-ckpt/model.safetensors" "$work/export-weights/model.safetensors" \
  || fail "export from the tp2 x pp2 checkpoint differs from the export of the run's weights"
echo "  tp2 x pp2 checkpoint exports the run's weights byte for byte"
echo "checkpoints: ok"
