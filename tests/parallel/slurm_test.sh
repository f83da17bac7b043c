#!/usr/bin/env bash
# Slurm, for real: a private cluster (Debian's slurm-wlm and munge, private_slurm.sh) runs
# the scripts of examples/slurm as a user would submit them, with only the size overridden
# on sbatch's command line (one node, two tasks, a CPU each) and the environment the
# scripts read (TIDE, RECIPE, RUN_DIR, DEVICE=cpu):
#   one-node.sbatch: two srun tasks are ranks 0 and 1 of a dp2 run (tide reads
#     SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID and the node list; no wrapper) and give one
#     process's losses and parameters within 1e-5;
#   lr-sweep.sbatch: a job array of two learning rates, each run equal to one process at
#     that rate;
#   scancel --signal=USR1 (what --signal=USR1@300 sends before the time limit): tide saves
#     a checkpoint and exits 138, the script requeues the job, and the job resumes from
#     that checkpoint to the uninterrupted job's losses and parameters, bit for bit.
# Skipped (exit 77), saying why, without root or without slurm-wlm and munge.
source "$(dirname "$0")/common.sh" "$1"
source "$(dirname "$0")/private_slurm.sh"
examples=$(cd "$(dirname "$0")/../../examples/slurm" && pwd)
trap 'stop_private_slurm; rm -rf "$work"' EXIT

why=$(private_slurm_missing)
if [[ -n $why ]]; then
  echo "skipped: $why"
  exit 77
fi
start_private_slurm "$work/slurm" || fail "the private Slurm did not start"
size=(--nodes=1 --ntasks-per-node=2 --cpus-per-task=1)
export TIDE=$tide DEVICE=cpu RECIPE=$work/llama.lua

job_field() {  # job_field JOB FIELD: a field of `scontrol show job`
  scontrol show job "$1" 2> /dev/null | tr ' ' '\n' | sed -n "s/^$2=//p" | head -1
}

# One node, two tasks.
train llama llama-1
RUN_DIR=$work/slurm-dp2 sbatch --wait "${size[@]}" --output="$work/slurm-dp2.out" "$examples/one-node.sbatch" \
  --quiet > /dev/null || { cat "$work/slurm-dp2.out"; fail "one-node.sbatch"; }
grep -q "rank 0 of 2 (set by srun (Slurm job [0-9]*)), rendezvous at localhost:" "$work/slurm-dp2.out" ||
  { cat "$work/slurm-dp2.out"; fail "rank 0 does not say srun set its place"; }
grep -q "dp2 x tp1 x pp1" "$work/slurm-dp2/train.log" || { cat "$work/slurm-dp2/train.log"; fail "not a dp2 run"; }
compare "$work/llama-1" "$work/slurm-dp2" 0 || fail "one-node.sbatch differs from one process"

# A learning-rate sweep: a job array of two tasks, one process each.
train llama llama-lr3e-3 --set optimizer.lr=3e-3
LRS="1e-3 3e-3" SWEEP_DIR=$work/sweep sbatch --wait --array=0-1 --cpus-per-task=1 \
  --output="$work/sweep-%a.out" "$examples/lr-sweep.sbatch" --quiet > /dev/null ||
  { cat "$work"/sweep-*.out; fail "lr-sweep.sbatch"; }
compare "$work/llama-1" "$work/sweep/lr-1e-3" 1 || fail "array task 0 (lr 1e-3) differs from one process"
compare "$work/llama-lr3e-3" "$work/sweep/lr-3e-3" 1 || fail "array task 1 (lr 3e-3) differs from one process"

# Stopped before the time limit, requeued, resumed. A constant rate after warm-up, so the
# run's length does not change its losses.
# The reference is the same job uninterrupted: a resume on the same layout is exact.
long=(--set schedule.steps=200 --set schedule.decay=constant --set eval.every=0)
RUN_DIR=$work/long-dp2 sbatch --wait "${size[@]}" --output="$work/long-dp2.out" "$examples/one-node.sbatch" \
  --quiet "${long[@]}" > /dev/null || { cat "$work/long-dp2.out"; fail "one-node.sbatch, 200 steps"; }
job=$(RUN_DIR=$work/requeue sbatch --parsable "${size[@]}" --output="$work/requeue.out" "$examples/one-node.sbatch" \
  --quiet "${long[@]}")
for _ in $(seq 1200); do
  [[ -f $work/requeue/metrics.jsonl && $(wc -l < "$work/requeue/metrics.jsonl") -ge 3 ]] && break
  sleep 0.1
done
[[ $(wc -l < "$work/requeue/metrics.jsonl") -ge 3 ]] || { cat "$work/requeue.out"; fail "job $job: no steps in 120 s"; }
scancel --signal=USR1 "$job"
# Slurm holds a requeued job for 121 s before it may start again; the test lifts the hold.
for _ in $(seq 600); do
  [[ $(job_field "$job" Restarts) == 1 && $(job_field "$job" JobState) == PENDING ]] && break
  sleep 0.1
done
[[ $(job_field "$job" Restarts) == 1 ]] || { cat "$work/requeue.out"; fail "job $job was not requeued after SIGUSR1"; }
# The hold guards slurmd, which revokes the first incarnation's credential when it ends:
# a job let out in the same second as that end failed to launch (FAILED, exit 1, 1 run in
# 3 beside a CPU hog; none in 5 once the test waited), which fits slurmd comparing the new
# credential's time with the revocation's at one-second resolution. So the test lifts the
# hold once the node is idle again and two seconds have passed.
for _ in $(seq 600); do
  [[ $(sinfo -h -n localhost -o %T) == idle ]] && break
  sleep 0.1
done
sleep 2
scontrol update JobId="$job" StartTime=now
for _ in $(seq 3000); do
  state=$(job_field "$job" JobState)
  [[ $state == COMPLETED || $state == FAILED || $state == CANCELLED ]] && break
  sleep 0.1
done
[[ $state == COMPLETED ]] || {
  cat "$work/requeue.out"
  scontrol show job "$job"
  tail -n 30 "$slurm_dir"/log/*.log
  fail "job $job ended $state after its requeue"
}
grep -q "checkpoint saved before the time limit: requeueing job $job" "$work/requeue.out" ||
  { cat "$work/requeue.out"; fail "the script did not requeue on exit status 138"; }
logs=("$work/requeue.out" "$work/requeue/train.log")
stopped=$(sed -n 's/.*stopped at step \([0-9]*\) by request.*/\1/p' "${logs[@]}" | head -1)
[[ -n $stopped && $stopped -lt 200 ]] || { cat "${logs[@]}"; fail "no stop with a checkpoint before step 200"; }
grep -q "restart 1" "$work/requeue.out" || { cat "$work/requeue.out"; fail "no second incarnation"; }
grep -q "resumed from .* at step $stopped$" "${logs[@]}" ||
  { cat "${logs[@]}"; fail "the requeued job did not resume from step $stopped"; }
compare "$work/long-dp2" "$work/requeue" 1 200 || fail "the requeued run differs from the uninterrupted one"
echo "  job $job: SIGUSR1 at step $stopped, checkpoint, requeue, resumed to step 200 with the same losses"
echo "slurm: ok"
