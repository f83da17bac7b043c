#!/usr/bin/env bash
# Checkpoints with real worker processes on CPU:
#  - save at step 5 of 10 and resume: steps 6-10 equal the uninterrupted run's exactly
#    (losses and final weights byte for byte) for one process, ZeRO-3 x2, tp2, pp2 and
#    pp2 interleaved over two chunks per stage;
#  - a checkpoint saved under dp2 x tp2 resumes as one process, as ZeRO-3 x4 and as pp2
#    with the uninterrupted run's losses within 1e-5;
#  - a flipped byte: `tide ckpt verify` names the file, --resume auto falls back;
#  - SIGKILL at random moments of a run that saves every step: the newest committed
#    checkpoint always verifies and resumes;
#  - a rank's share split over several files written side by side (checkpoint.writers)
#    resumes exactly and reshards;
#  - a save that cannot be written (a file in the way, a full disk, a read-only one):
#    training goes on, the error is logged, older checkpoints stay;
#  - export from a tp2 x pp2 checkpoint equals the export of the same run's weights.
source "$(dirname "$0")/common.sh" "$1"

echo "exact resume:"
for layout in "one:" "zero3:--nproc 2 --set parallel.zero=3" "tp2:--nproc 2 --set parallel.tp=2" \
              "pp2:--nproc 2 --set parallel.pp=2" \
              "pp2v2:--nproc 2 --set parallel.pp=2 --set parallel.virtual_stages=2 --set model.n_layers=4" \
              "one3files:--set checkpoint.writers=3" \
              "zero3x3files:--nproc 2 --set parallel.zero=3 --set checkpoint.writers=3"; do
  name=${layout%%:*}
  read -r -a args <<< "${layout#*:}"
  shape=llama
  [[ $name == pp2* ]] && shape=bloom  # tied embeddings across the stages (and, interleaved, the chunks)
  train $shape $shape-$name --set checkpoint.every=5 "${args[@]}"
  resume_from_5 $shape $shape-$name $shape-$name-resumed "${args[@]}"
  compare "$work/$shape-$name" "$work/$shape-$name-resumed" 1 || fail "$name: resumed run differs"
  cmp -s "$work/$shape-$name/model.safetensors" "$work/$shape-$name-resumed/model.safetensors" \
    || fail "$name: resumed weights differ"
done

files=$(cd "$work/llama-zero3x3files/checkpoints/step-00000005" && echo *.safetensors)
[[ $files == "rank-00000.1.safetensors rank-00000.2.safetensors rank-00000.safetensors rank-00001.1.safetensors rank-00001.2.safetensors rank-00001.safetensors" ]] \
  || fail "checkpoint.writers=3 on 2 ranks wrote: $files"
echo "  with checkpoint.writers=3 each rank wrote 3 files: $files"

echo "resharded resume (saved under dp2 x tp2, two files per rank):"
train bloom bloom-1
train bloom bloom-dp2-tp2 --set checkpoint.every=5 --nproc 4 --set parallel.tp=2 --set checkpoint.writers=2
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
cp -r "$work/llama-one3files/checkpoints/step-00000010" "$work/corrupt-part"
truncate -s -1 "$work/corrupt-part/rank-00000.2.safetensors"
if $tide ckpt verify "$work/corrupt-part" > "$work/log" 2>&1; then fail "verify passed a truncated part"; fi
grep -q "rank-00000.2.safetensors: .* bytes, the manifest says" "$work/log" || { cat "$work/log"; fail "verify does not name the part"; }
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
  mode=true writers=1
  (( trial % 2 == 0 )) && mode=false
  (( trial > 4 )) && writers=3  # the last four split each save over three files
  $tide train "$work/llama.lua" --run-dir "$work/killed" --quiet --set schedule.steps=100000 --set checkpoint.every=1 \
    --set checkpoint.keep_last=2 --set eval.every=0 --set checkpoint.async=$mode --set checkpoint.writers=$writers \
    --set model.dim=256 --set model.n_heads=4 --set model.n_kv_heads=2 --set model.n_layers=4 --set model.multiple_of=64 \
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

# A full disk and a read-only one: a small tmpfs on the run's checkpoints directory, in a
# mount namespace of its own (unshare -m as root, else a user namespace), so that nothing
# is left mounted whatever happens.
if unshare -m true 2> /dev/null; then ns=(unshare -m); elif unshare -rm true 2> /dev/null; then ns=(unshare -rm);
else fail "cannot make a mount namespace (unshare -m / -rm) for the full and read-only disk tests"; fi
only_step_5_kept() {  # only_step_5_kept RUN WHY: 15 steps trained, the saves of steps 10 and 15 failed with WHY
  local run=$work/$1
  [[ $(grep -c "checkpoint failed: step .*$2" "$run/train.log") -eq 2 ]] \
    || { cat "$run/train.log"; fail "$1: the two failed saves ($2) are not both in the run log"; }
  [[ $(wc -l < "$run/metrics.jsonl") -eq 15 ]] || fail "$1: training did not go on"
  [[ $(cut -d' ' -f1 "$run.list") == "$run/checkpoints/step-00000005" ]] || fail "$1: $(cat "$run.list")"
}
ckpt_bytes=$(du -sb "$work/llama-one/checkpoints/step-00000005" | cut -f1)
echo "a full disk (a tmpfs with room for one checkpoint of $ckpt_bytes bytes):"
mkdir -p "$work/full/checkpoints"
"${ns[@]}" bash -c "mount -t tmpfs -o size=$((ckpt_bytes * 3 / 2)) tide-full '$work/full/checkpoints' &&
  $tide train '$work/llama.lua' --run-dir '$work/full' --quiet --set checkpoint.every=5 --set schedule.steps=15 \
    --set eval.every=0 2> '$work/full.log' &&
  $tide ckpt list '$work/full' > '$work/full.list' && $tide ckpt verify '$work/full/checkpoints/step-00000005'" \
  > "$work/log" 2>&1 || { cat "$work/log" "$work/full.log"; fail "full disk run"; }
only_step_5_kept full "No space left on device"
echo "  15 steps trained; the saves of steps 10 and 15 failed with ENOSPC, each logged; step 5 verifies"
echo "a read-only disk (the same tmpfs remounted read-only after step 5's save):"
mkdir -p "$work/readonly/checkpoints"
"${ns[@]}" bash -c "mount -t tmpfs -o size=64m tide-ro '$work/readonly/checkpoints' &&
  $tide train '$work/llama.lua' --run-dir '$work/readonly' --quiet --set checkpoint.every=5 --set schedule.steps=5 \
    --set eval.every=0 2> '$work/ro.log' &&
  mount -o remount,ro '$work/readonly/checkpoints' &&
  $tide train '$work/llama.lua' --run-dir '$work/readonly' --quiet --set checkpoint.every=5 --set schedule.steps=15 \
    --set eval.every=0 --resume auto 2>> '$work/ro.log' &&
  $tide ckpt list '$work/readonly' > '$work/readonly.list' && $tide ckpt verify '$work/readonly/checkpoints/step-00000005'" \
  > "$work/log" 2>&1 || { cat "$work/log" "$work/ro.log"; fail "read-only disk run"; }
only_step_5_kept readonly "Read-only file system"
echo "  resumed from step 5 and trained to 15; the saves failed with EROFS; step 5 verifies"

echo "export:"
train bloom bloom-tp2-pp2 --set checkpoint.every=5 --nproc 4 --set parallel.tp=2 --set parallel.pp=2
$tide ckpt export "$work/bloom-tp2-pp2/checkpoints/step-00000010" --out "$work/export-ckpt" 2> /dev/null
$tide convert export "$work/bloom-tp2-pp2" --out "$work/export-weights" 2> /dev/null
cmp -s "$work/export-ckpt/model.safetensors" "$work/export-weights/model.safetensors" \
  || fail "export from the tp2 x pp2 checkpoint differs from the export of the run's weights"
echo "  tp2 x pp2 checkpoint exports the run's weights byte for byte"
echo "checkpoints: ok"
