#!/usr/bin/env bash
# Two ranks sharing one GPU (label cuda; skipped where no CUDA device is present:
# tests/tools/cuda_probe.py). NCCL refuses two ranks on one device, so these groups use Gloo
# (parallel.backend = "gloo"), which moves the ranks' CUDA tensors through host memory:
#  - ZeRO-3 dp2, tp2, pp2 and context parallelism's cp2 in both forms (all-gather: the
#    unmasked chunks' node over CUDA's fused kernels; all-to-all) reproduce one rank's
#    losses on the same GPU (relative 1e-5) and, joined back into one model, its final
#    parameters (1e-5), as on the CPU;
#  - in bf16 (the fused kernels' bf16 path), ZeRO-2 dp2 (tide's AdamW kernel on each
#    rank's shard of the flat buffers), ZeRO-3 dp2 (units gathered in bf16 and widened
#    on the GPU), pp2 (bf16 between the stages) and cp2 in both forms (the chunks' node
#    through the flash kernel with grouped keys in place) agree with one rank in bf16 to
#    bf16's resolution;
#  - two ranks on one GPU with the default backend (NCCL) are refused, naming the field.
source "$(dirname "$0")/common.sh" "$1"
"${TIDE_PYTHON:-python3}" "$(dirname "$0")/../tools/cuda_probe.py" || exit $?
# One GPU: the first of those visible.
visible=${CUDA_VISIBLE_DEVICES:-0}
export CUDA_VISIBLE_DEVICES=${visible%%,*}

# fp32: the comparisons are fp32 ones (precision.compute is bf16 on CUDA by default).
cuda=(--set device=cuda --set precision.compute=fp32)
train llama cuda-1 "${cuda[@]}"
train llama cuda-zero3-dp2 --nproc 2 "${cuda[@]}" --set parallel.backend=gloo --set parallel.zero=3
train llama cuda-tp2 --nproc 2 "${cuda[@]}" --set parallel.backend=gloo --set parallel.tp=2
train llama cuda-pp2 --nproc 2 "${cuda[@]}" --set parallel.backend=gloo --set parallel.pp=2
train llama cuda-cp2 --nproc 2 "${cuda[@]}" --set parallel.backend=gloo --set parallel.cp=2
train llama cuda-cp2-a2a --nproc 2 "${cuda[@]}" --set parallel.backend=gloo --set parallel.cp=2 \
  --set parallel.cp_comm=all_to_all
compare "$work/cuda-1" "$work/cuda-zero3-dp2" 0 || fail "ZeRO-3 dp2 on one GPU differs from one rank"
compare "$work/cuda-1" "$work/cuda-tp2" 0 || fail "tp2 on one GPU differs from one rank"
compare "$work/cuda-1" "$work/cuda-pp2" 0 || fail "pp2 on one GPU differs from one rank"
compare "$work/cuda-1" "$work/cuda-cp2" 0 || fail "cp2 on one GPU differs from one rank"
compare "$work/cuda-1" "$work/cuda-cp2-a2a" 0 || fail "all-to-all cp2 on one GPU differs from one rank"

bf16=(--set device=cuda --set precision.compute=bf16)
train llama cuda-bf16-1 "${bf16[@]}"
train llama cuda-bf16-zero2-dp2 --nproc 2 "${bf16[@]}" --set parallel.backend=gloo --set parallel.zero=2
train llama cuda-bf16-zero3-dp2 --nproc 2 "${bf16[@]}" --set parallel.backend=gloo --set parallel.zero=3
train llama cuda-bf16-pp2 --nproc 2 "${bf16[@]}" --set parallel.backend=gloo --set parallel.pp=2
train llama cuda-bf16-cp2 --nproc 2 "${bf16[@]}" --set parallel.backend=gloo --set parallel.cp=2
train llama cuda-bf16-cp2-a2a --nproc 2 "${bf16[@]}" --set parallel.backend=gloo --set parallel.cp=2 \
  --set parallel.cp_comm=all_to_all
compare_half "$work/cuda-bf16-1" "$work/cuda-bf16-zero2-dp2" 8 || fail "bf16 ZeRO-2 dp2 on one GPU differs from one rank"
compare_half "$work/cuda-bf16-1" "$work/cuda-bf16-zero3-dp2" 8 || fail "bf16 ZeRO-3 dp2 on one GPU differs from one rank"
compare_half "$work/cuda-bf16-1" "$work/cuda-bf16-pp2" 8 || fail "bf16 pp2 on one GPU differs from one rank"
compare_half "$work/cuda-bf16-1" "$work/cuda-bf16-cp2" 8 || fail "bf16 cp2 on one GPU differs from one rank"
compare_half "$work/cuda-bf16-1" "$work/cuda-bf16-cp2-a2a" 8 || fail "bf16 all-to-all cp2 on one GPU differs"

refused llama "parallel.backend" --nproc 2 "${cuda[@]}" --set parallel.zero=3
echo "shared GPU: ok"
