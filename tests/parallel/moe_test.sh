#!/usr/bin/env bash
# Mixture of experts (model.moe_experts) through `tide train` with real worker processes:
#  - one process trains: the loss falls, and every step reports the router's load
#    balance (moe_balance: E sum_e f_e P_e, at least 1/E and at most E);
#  - the load-balancing loss moves the training (moe_aux_loss 0 trains otherwise) and
#    not the reported loss of the first step, which is the language model's alone;
#  - dp2, ZeRO-1/2/3 x2 and ZeRO-3 x2 with every block recomputed reproduce one process's
#    losses and final parameters (relative 1e-5), and ZeRO-1 plain dp's bit for bit;
#  - pp2, and pp2 x dp2 under ZeRO-1, reproduce one process's losses and parameters, and
#    so does interleaved 1F1B (four blocks, two chunks a stage); the balance reported is
#    one process's (relative 1e-5);
#  - tp2 (every expert's columns split), dp2 x tp2 under ZeRO-1 and tp2 x pp2 reproduce
#    one process's losses, parameters and balance;
#  - with a gated shared expert (Qwen2-MoE's form) and a sequence-wise balance loss, tp2,
#    ep2 and ZeRO-3 reproduce one process's losses, parameters and balance;
#  - every step reports the busiest expert's load over the even share (moe_max_load,
#    worst block, whole batch), one process's on every layout but for flipped choices;
#  - a run resumed from its step-5 checkpoint ends with the uninterrupted run's bytes;
#  - auxiliary-loss-free balancing (DeepSeek-V3: sigmoid scores, routing biases moved by
#    the step's loads, no balance loss; group-limited routing; a router z-loss, reported
#    as moe_z): the final weights carry biases that are whole
#    multiples of the rate, the busiest expert's load ends lower than without them, ep2
#    and tp2 under ZeRO-3 and pp2 under ZeRO-1 reproduce one process's losses, weights
#    and biases, and a
#    resume from the step-5 checkpoint (which carries the biases) ends with the
#    uninterrupted run's bytes, and under pp2 with its values;
#  - a capacity factor of 0.5 drops at least half the pairs (moe_dropped) and moves the
#    first loss, and ep2 reproduces one process's losses, parameters and drops with it;
#  - context parallelism is refused naming model.moe_experts, sequence parallelism naming
#    parallel.sequence_parallel.
source "$(dirname "$0")/common.sh" "$1"

write_recipe moe "tide.models.llama { vocab_size = 300, dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2, ffn_dim = 48, moe_experts = 4, moe_top_k = 2, max_seq_len = 64 }"

train moe moe-1 --set checkpoint.every=5
"${TIDE_PYTHON:-python3}" - "$work/moe-1" <<'PY' || fail "the MoE run's metrics"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
assert len(rows) == 10, len(rows)
assert all("moe_balance" in r for r in rows), "a step without moe_balance"
b = [r["moe_balance"] for r in rows]
assert all(0.25 <= x <= 4 for x in b), b
# The busiest expert's load over the even share, worst block: 1 to E / k = 2.
m = [r["moe_max_load"] for r in rows]
assert all(1 <= x <= 2 for x in m), m
assert rows[-1]["loss"] < rows[0]["loss"] - 0.3, (rows[0]["loss"], rows[-1]["loss"])
print(f"  moe-1: loss {rows[0]['loss']:.3f} -> {rows[-1]['loss']:.3f}, balance {b[0]:.3f} -> {b[-1]:.3f}, "
      f"max load {m[0]:.3f} -> {m[-1]:.3f}")
PY

train moe moe-no-aux --set model.moe_aux_loss=0
"${TIDE_PYTHON:-python3}" - "$work/moe-1" "$work/moe-no-aux" <<'PY' || fail "the load-balancing loss"
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(run + "/metrics.jsonl")] for run in sys.argv[1:3])
assert a[0] == b[0], ("the first step's loss is the language model's alone", a[0], b[0])
worst = max(abs(x - y) / x for x, y in zip(a, b))
assert worst > 1e-5, f"moe_aux_loss 0 trains as 0.01 does (within {worst:.1e})"
print(f"  moe-no-aux: the same first loss, later ones differ by up to {worst:.1e} relative")
PY

train moe moe-dp2 --nproc 2
compare "$work/moe-1" "$work/moe-dp2" 0 || fail "MoE dp2 differs from one process"
for z in 1 2 3; do
  train moe moe-zero$z --nproc 2 --set parallel.zero=$z
  compare "$work/moe-1" "$work/moe-zero$z" 0 || fail "MoE ZeRO-$z differs from one process"
done
compare "$work/moe-dp2" "$work/moe-zero1" 1 || fail "MoE ZeRO-1 differs from plain dp"
train moe moe-zero3-ckpt --nproc 2 --set parallel.zero=3 --set model.activation_checkpointing=true
compare "$work/moe-1" "$work/moe-zero3-ckpt" 0 || fail "MoE ZeRO-3 with recomputed blocks differs from one process"

train moe moe-pp2 --nproc 2 --set parallel.pp=2
compare "$work/moe-1" "$work/moe-pp2" 0 || fail "MoE pp2 differs from one process"
balance_matches "$work/moe-1" "$work/moe-pp2" || fail "MoE pp2 reports another balance"
train moe moe-pp2-dp2 --nproc 4 --set parallel.pp=2 --set parallel.zero=1
compare "$work/moe-1" "$work/moe-pp2-dp2" 0 || fail "MoE pp2 x dp2 ZeRO-1 differs from one process"
balance_matches "$work/moe-1" "$work/moe-pp2-dp2" || fail "MoE pp2 x dp2 reports another balance"
train moe moe-tp2 --nproc 2 --set parallel.tp=2
compare "$work/moe-1" "$work/moe-tp2" 0 || fail "MoE tp2 differs from one process"
balance_matches "$work/moe-1" "$work/moe-tp2" || fail "MoE tp2 reports another balance"
train moe moe-dp2-tp2 --nproc 4 --set parallel.tp=2 --set parallel.zero=1
compare "$work/moe-1" "$work/moe-dp2-tp2" 0 || fail "MoE dp2 x tp2 ZeRO-1 differs from one process"
train moe moe-tp2-pp2 --nproc 4 --set parallel.tp=2 --set parallel.pp=2
compare "$work/moe-1" "$work/moe-tp2-pp2" 0 || fail "MoE tp2 x pp2 differs from one process"
# A gated shared expert beside the routed ones (Qwen2-MoE's form): its columns split over
# tp as a dense MLP's, held whole by both expert-parallel ranks, sharded by ZeRO-3.
# Its balance loss sequence-wise (DeepSeek-V3's), which every layout takes alike.
shared=(--set model.moe_shared_ffn_dim=32 --set model.moe_shared_gate=true --set model.moe_balance_scope=sequence)
train moe moe-shared-1 "${shared[@]}"
for layout in parallel.tp=2 parallel.ep=2 parallel.zero=3; do
  train moe "moe-shared-${layout//[.=]/-}" --nproc 2 "${shared[@]}" --set "$layout"
  compare "$work/moe-shared-1" "$work/moe-shared-${layout//[.=]/-}" 0 || fail "MoE with a shared expert, $layout, differs from one process"
  balance_matches "$work/moe-shared-1" "$work/moe-shared-${layout//[.=]/-}" || fail "MoE with a shared expert, $layout, reports another balance"
done
train moe moe4-1 --set model.n_layers=4
train moe moe4-pp2v2 --nproc 2 --set model.n_layers=4 --set parallel.pp=2 --set parallel.virtual_stages=2
compare "$work/moe4-1" "$work/moe4-pp2v2" 0 || fail "MoE interleaved 1F1B differs from one process"

mkdir -p "$work/moe-resumed/checkpoints"
cp -r "$work/moe-1/checkpoints/step-00000005" "$work/moe-resumed/checkpoints/"
train moe moe-resumed --resume "$work/moe-resumed/checkpoints/step-00000005"
grep -q "resumed from" "$work/moe-resumed/train.log" || fail "moe-resumed did not resume"
cmp -s "$work/moe-1/model.safetensors" "$work/moe-resumed/model.safetensors" \
  || fail "the resumed MoE run's weights are not the uninterrupted run's bytes"
echo "  moe-resumed: final weights the uninterrupted run's bytes"

# Auxiliary-loss-free balancing at a rate that shows in ten steps (DeepSeek-V3's is 0.001
# over hundreds of thousands), with DeepSeek-V3's group-limited routing (two groups of two
# experts, one group a token: under ep2 each token's rows go to one rank) and a router
# z-loss.
sigmoid=(--set model.moe_aux_loss=0 --set model.moe_router=sigmoid --set model.moe_groups=2
  --set model.moe_group_top_k=1 --set model.moe_z_loss=0.01)
bias=("${sigmoid[@]}" --set model.moe_expert_bias=true --set model.moe_bias_update_rate=0.02)
train moe moe-sigmoid "${sigmoid[@]}"
train moe moe-bias-1 "${bias[@]}" --set checkpoint.every=5
"${TIDE_PYTHON:-python3}" - "$work/moe-sigmoid" "$work/moe-bias-1" <<'PY' || fail "auxiliary-loss-free balancing"
import json, struct, sys
import numpy as np

def tensors(run):
    with open(run + "/model.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    return {k: np.frombuffer(data[e["data_offsets"][0]:e["data_offsets"][1]], dtype=np.float32)
            for k, e in header.items() if k != "__metadata__"}

plain, biased = tensors(sys.argv[1]), tensors(sys.argv[2])
assert not any(k.endswith("expert_bias") for k in plain), "a run without model.moe_expert_bias saved biases"
b = np.stack([biased[f"model.layers.{i}.mlp.expert_bias"] for i in range(2)])
steps = b / 0.02  # each step moved each bias by -1, 0 or +1 rates, in fp32
assert np.all(np.abs(steps - np.round(steps)) < 1e-3), b
assert np.all(np.abs(np.round(steps)) <= 10) and np.any(b != 0), b
load = lambda run: [json.loads(l)["moe_max_load"] for l in open(run + "/metrics.jsonl")]
a, c = load(sys.argv[1]), load(sys.argv[2])
assert a[0] == c[0], ("the first step routes before any bias moved", a[0], c[0])
assert np.mean(c[5:]) < np.mean(a[5:]), (a, c)
z = [json.loads(l)["moe_z"] for l in open(sys.argv[2] + "/metrics.jsonl")]
assert len(z) == 10 and all(x > 0 for x in z), z
print(f"  moe-bias-1: biases {np.round(steps).astype(int).tolist()} x 0.02; max load over steps 6-10 "
      f"{np.mean(a[5:]):.3f} without, {np.mean(c[5:]):.3f} with; router z {z[0]:.3f} -> {z[-1]:.3f}")
PY
for layout in parallel.ep=2,parallel.zero=3 parallel.pp=2,parallel.zero=1 parallel.tp=2,parallel.zero=3; do
  run="moe-bias-${layout//[.=,]/-}"
  train moe "$run" --nproc 2 "${bias[@]}" --set "${layout%,*}" --set "${layout#*,}"
  compare "$work/moe-bias-1" "$work/$run" 0 || fail "auxiliary-loss-free balancing, $layout, differs from one process"
done
resume_from_5 moe moe-bias-1 moe-bias-resumed "${bias[@]}"
cmp -s "$work/moe-bias-1/model.safetensors" "$work/moe-bias-resumed/model.safetensors" \
  || fail "the resumed run with routing biases does not end with the uninterrupted run's bytes"
resume_from_5 moe moe-bias-1 moe-bias-resumed-pp2 --nproc 2 "${bias[@]}" --set parallel.pp=2
compare "$work/moe-bias-1" "$work/moe-bias-resumed-pp2" 0 || fail "the routing biases resumed under pp2 differ"
echo "  moe-bias: ep2 and tp2 under ZeRO-3, pp2 under ZeRO-1 as one process; resumed from step 5 the same bytes, under pp2 the same values"

# A capacity of half the even share: each rank drops its micro-batches' pairs past it, so
# ep2 (each rank its own micro-batches, as one process has them) reproduces one process.
train moe moe-cap-1 --set model.moe_capacity_factor=0.5
train moe moe-cap-ep2 --nproc 2 --set model.moe_capacity_factor=0.5 --set parallel.ep=2
compare "$work/moe-cap-1" "$work/moe-cap-ep2" 0 || fail "a capacity under ep2 differs from one process"
"${TIDE_PYTHON:-python3}" - "$work/moe-1" "$work/moe-cap-1" "$work/moe-cap-ep2" <<'PY' || fail "the capacity factor"
import json, sys
plain, capped, ep2 = ([json.loads(l) for l in open(run + "/metrics.jsonl")] for run in sys.argv[1:4])
assert plain[0]["loss"] != capped[0]["loss"], ("half the even share drops pairs: the first loss moves", plain, capped)
assert "moe_dropped" not in plain[0], "a dropless run reports drops"
d = [r["moe_dropped"] for r in capped]
# At half the even share at least half the pairs drop; the ranks' sum is one process's.
assert all(0.5 <= x < 1 for x in d), d
assert [r["moe_dropped"] for r in ep2] == d, ([r["moe_dropped"] for r in ep2], d)
print(f"  moe-cap-1: first loss {capped[0]['loss']:.4f}, dropless {plain[0]['loss']:.4f}; "
      f"dropped {d[0]:.1%} -> {d[-1]:.1%}, ep2 the same")
PY

refused moe "model.moe_experts" --nproc 2 --set parallel.cp=2
refused moe "parallel.sequence_parallel" --nproc 2 --set parallel.tp=2 --set parallel.sequence_parallel=true
echo "  cp2 refused naming model.moe_experts, tp2 with sequence parallelism naming parallel.sequence_parallel"
