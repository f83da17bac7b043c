#!/usr/bin/env bash
# parallel.auto with real worker processes: the launcher asks the planner, logs its choice
# with the runner-up, and every rank trains that layout (config.json records it) on 1, 2
# and 4 processes, and a mixture of experts on 2; a model too large for the machine is refused before any worker starts,
# with the shortfall; ranks that decide on their own need a stored calibration.
# The calibration is XDG_CACHE_HOME's (ctest's cli.calibrate leaves it); run alone, the
# test calibrates into its own.
source "$(dirname "$0")/common.sh" "$1"
if [[ ! -s ${XDG_CACHE_HOME:-/nonexistent}/tide/calibration-cpu.json ]]; then
  export XDG_CACHE_HOME=$work/cache
  $tide plan --calibrate > "$work/calibrate.txt" 2>&1 || { cat "$work/calibrate.txt"; fail "tide plan --calibrate"; }
fi

for n in 1 2 4; do
  $tide train "$work/llama.lua" --nproc $n --auto --run-dir "$work/auto-$n" --set schedule.steps=3 \
    --set eval.every=0 2> "$work/auto-$n.log" || { cat "$work/auto-$n.log"; fail "--auto on $n processes"; }
  grep -q "parallel.auto chose .* for $n ranks of cpu" "$work/auto-$n.log" || { cat "$work/auto-$n.log"; fail "no choice logged ($n)"; }
  [[ $n == 1 ]] || grep -q "runner-up" "$work/auto-$n.log" || { cat "$work/auto-$n.log"; fail "no runner-up logged ($n)"; }
  /usr/bin/python3 - "$work/auto-$n" "$n" <<'PY' || fail "the run's layout is not the planner's ($n)"
import json, sys
run, n = sys.argv[1], int(sys.argv[2])
cfg = json.load(open(f"{run}/config.json"))
p = cfg["parallel"]
assert not p["auto"], p
dp = p["dp"] or n // (p["tp"] * p["pp"])
assert dp * p["tp"] * p["pp"] == n, p
assert cfg["batch"]["global_batch"] == 8, cfg["batch"]
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
assert len(rows) == 3, len(rows)
print(f"  {n} process(es): dp{dp} tp{p['tp']} pp{p['pp']} zero{p['zero']} micro-batch {cfg['batch']['micro_batch']}, "
      f"3 steps, loss {rows[-1]['loss']:.3f}")
PY
done

# A mixture of experts: the planner weighs expert parallelism beside the rest, and both
# ranks train the layout it chose, ep included.
$tide train "$work/llama.lua" --nproc 2 --auto --run-dir "$work/auto-moe" --set schedule.steps=3 --set eval.every=0 \
  --set model.moe_experts=4 --set model.moe_top_k=2 2> "$work/auto-moe.log" \
  || { cat "$work/auto-moe.log"; fail "--auto with a mixture of experts"; }
chosen=$(grep -o "parallel.auto chose [^:]* for 2 ranks" "$work/auto-moe.log") \
  || { cat "$work/auto-moe.log"; fail "no choice logged (experts)"; }
/usr/bin/python3 - "$work/auto-moe" "$chosen" <<'PY' || fail "the run's layout is not the planner's (experts)"
import json, sys
run, chosen = sys.argv[1], sys.argv[2]
p = json.load(open(f"{run}/config.json"))["parallel"]
assert p["ep"] in (1, 2) and (" ep2" in chosen) == (p["ep"] == 2), (p, chosen)
rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
assert len(rows) == 3 and all("moe_balance" in r for r in rows), rows[-1]
print(f"  experts on 2 processes: {chosen}, ep{p['ep']}, loss {rows[-1]['loss']:.3f}")
PY

# Too large: a 70B model on this machine's two ranks.
if $tide train "$work/llama.lua" --nproc 2 --auto --run-dir "$work/huge" --set model.dim=8192 --set model.n_layers=80 \
     --set model.n_heads=64 --set model.n_kv_heads=8 --set model.max_seq_len=64 2> "$work/huge.log"; then
  fail "a 70B model was planned onto this machine"
fi
grep -q "parallel.auto: no layout of 2 ranks fits: the closest, .* does not fit: needs .* GiB of" "$work/huge.log" \
  || { cat "$work/huge.log"; fail "the refusal does not give the shortfall"; }
[[ ! -e $work/huge/metrics.jsonl ]] || fail "the refused run trained"
echo "  70B on 2 ranks: $(grep -o 'no layout of 2 ranks fits.*' "$work/huge.log" | cut -c1-150)"

# Ranks that decide on their own (the environment a launcher like torchrun sets) read the
# stored calibration; without one they refuse.
XDG_CACHE_HOME=$work/empty WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 \
  $tide train "$work/llama.lua" --auto --run-dir "$work/independent" 2> "$work/independent.log" \
  && fail "a rank without a stored calibration chose a layout alone"
grep -q "run \`tide plan --calibrate\` on this machine first" "$work/independent.log" \
  || { cat "$work/independent.log"; fail "the refusal does not say to calibrate"; }
echo "parallel.auto: ok"
