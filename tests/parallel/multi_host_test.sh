#!/usr/bin/env bash
# Several hosts on one machine: two network namespaces ("hosts" 10.231.0.1 and
# 10.231.0.2, each with its own loopback) joined by a veth pair. `tide train --nnodes 2
# --node-rank K --master 10.231.0.1:PORT` runs in each, as on two machines sharing a
# filesystem, and every layout reproduces one process's losses (relative 1e-5) and final
# parameters (1e-5): dp2 and ZeRO-3 dp2 with a rank on each host, and tp2 x dp2 with the
# tensor-parallel pair inside a host and data parallelism across the link. Then node
# loss: host b's link taken down, and host b's processes killed; the survivors end within
# parallel.node_timeout_s naming the lost host and ranks, and the run resumes from its
# newest checkpoint on one host and again on two.
# Skipped (exit 77) where network namespaces cannot be made (not root, no iproute2).
source "$(dirname "$0")/common.sh" "$1"

source "$(dirname "$0")/netns_hosts.sh"
trap 'if [[ -n $launcher ]]; then kill -9 $launcher 2>/dev/null || true; fi; remove_hosts; rm -rf "$work"' EXIT
make_hosts || exit 77

port=29611
# across RUN NPROC [tide train options...]: one launcher per host, the same run directory
# (a shared filesystem, as checkpoints need), rank 0's store on host a.
across() {
  local run=$1 nproc=$2
  shift 2
  local pids=()
  for k in 0 1; do
    ip netns exec "${hosts[$k]}" $tide train "$work/llama.lua" --run-dir "$work/$run" --quiet --nproc "$nproc" \
      --nnodes 2 --node-rank $k --master "${addresses[0]}:$port" "$@" 2> "$work/$run-host$k.log" &
    pids+=($!)
  done
  local status=0
  for p in "${pids[@]}"; do wait "$p" || status=1; done
  if (( status != 0 )); then
    cat "$work/$run-host0.log" "$work/$run-host1.log"
    fail "$run across two hosts"
  fi
  port=$((port + 1))
}

train llama llama-1
across dp2 1
compare "$work/llama-1" "$work/dp2" 0 || fail "dp2 across two hosts differs from one process"
across zero3-dp2 1 --set parallel.zero=3
compare "$work/llama-1" "$work/zero3-dp2" 0 || fail "ZeRO-3 dp2 across two hosts differs from one process"
across tp2-dp2 2 --set parallel.tp=2
compare "$work/llama-1" "$work/tp2-dp2" 0 || fail "tp2 x dp2 across two hosts differs from one process"
grep -q "dp2 x tp2 x pp1" "$work/tp2-dp2/train.log" || { cat "$work/tp2-dp2/train.log"; fail "not a dp2 x tp2 layout"; }

# Node loss. A long dp2 run across the hosts (constant learning rate after warm-up, so a
# run's length does not change its losses; a checkpoint every 2 steps), until its metrics
# have `rows` rows. Sets $started (seconds) and $pids (one launcher per host).
long=(--set schedule.steps=100000 --set schedule.decay=constant --set checkpoint.every=2 --set eval.every=0
      --set parallel.node_timeout_s=10)
start_across() {  # start_across RUN ROWS
  local run=$1 rows=$2
  pids=()
  for k in 0 1; do
    ip netns exec "${hosts[$k]}" $tide train "$work/llama.lua" --run-dir "$work/$run" --quiet --nnodes 2 \
      --node-rank $k --master "${addresses[0]}:$port" "${long[@]}" 2> "$work/$run-host$k.log" &
    pids+=($!)
  done
  port=$((port + 1))
  for _ in $(seq 600); do
    [[ -f "$work/$run/metrics.jsonl" && $(wc -l < "$work/$run/metrics.jsonl") -ge $rows ]] && break
    sleep 0.1
  done
  started=$(date +%s)
}
# ended_naming PID LOG WHAT...: the launcher exits non-zero within the node timeout (10 s)
# and a margin, and its host's log names each WHAT on one error line.
ended_naming() {
  local pid=$1 log=$2
  shift 2
  local status=0
  wait "$pid" || status=$?
  local took=$(( $(date +%s) - started ))
  (( status != 0 )) || { cat "$log"; fail "a survivor exited 0 after its peer host was lost"; }
  (( took <= 40 )) || { cat "$log"; fail "a survivor took ${took}s to notice its peer host was lost"; }
  local line
  line=$(grep "\[error\] rank [0-9]*: " "$log" | tail -n 1)
  for what in "$@"; do
    [[ $line == *"$what"* ]] || { cat "$log"; fail "the survivor's error line does not name '$what': $line"; }
  done
  echo "  survivor ended in ${took}s: ${line:0:220}"
}

# Host b's link goes down (no connection is reset: only the heartbeats can tell). Each side
# ends within parallel.node_timeout_s, naming the other.
start_across link 4
ip -n "${hosts[1]}" link set "${veths[1]}" down
ended_naming "${pids[0]}" "$work/link-host0.log" "lost host ${addresses[1]}" "rank 1"
ended_naming "${pids[1]}" "$work/link-host1.log" "lost host ${addresses[0]}"
ip -n "${hosts[1]}" link set "${veths[1]}" up

# Every tide process of host b killed: host a's rank fails on the dropped connections and
# names the host and rank it lost; a save in flight is abandoned, the committed ones stay.
start_across killed 5
ip netns pids "${hosts[1]}" | xargs -r kill -9
ended_naming "${pids[0]}" "$work/killed-host0.log" "${addresses[1]}" "rank 1 silent for"

# --resume auto on one host (2 ranks -> 1), then across both again (1 -> 2): each continues
# from the newest committed checkpoint with one process's losses (within 1e-5, as a change of
# layout promises: docs/checkpoints.md).
newest=$(ls "$work/killed/checkpoints" | grep -v tmp | grep '^step-' | sort | tail -n 1)
[[ -n $newest ]] || fail "no committed checkpoint survived"
c=$((10#${newest#step-}))
train llama reference --set schedule.decay=constant --set schedule.steps=$((c + 4))
ip netns exec "${hosts[0]}" $tide train "$work/llama.lua" --run-dir "$work/killed" --quiet --resume auto \
  --set schedule.decay=constant --set schedule.steps=$((c + 2)) 2> "$work/resume1.log" || { cat "$work/resume1.log"; fail "resume on one host"; }
across killed 1 --resume auto --set schedule.decay=constant --set schedule.steps=$((c + 4))
"${TIDE_PYTHON:-python3}" - "$work/reference" "$work/killed" "$c" <<'PY' || fail "the resumed losses"
import json, sys
ref = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[1] + "/metrics.jsonl"))}
got = {r["step"]: r["loss"] for r in map(json.loads, open(sys.argv[2] + "/metrics.jsonl"))}
c = int(sys.argv[3])
for step in range(c + 1, c + 5):
    assert abs(got[step] - ref[step]) <= 1e-5 * ref[step], (step, got[step], ref[step])
print(f"  resumed from step {c}: 2 -> 1 host (steps {c + 1}-{c + 2}) and 1 -> 2 hosts (steps {c + 3}-{c + 4}) "
      "match one process within 1e-5")
PY
echo "multi-host: ok"
