"""The model shapes the benches share, and the tide overrides that train one of them
on the bundled recipe (LLaMA, no GQA) with the bench's own data and batch."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "recipes", "llama", "llama-tiny.lua")
SHAPES = {
    "tiny": dict(dim=256, layers=4, heads=4, vocab=8192, seq=256, batch=8),
    "small": dict(dim=512, layers=8, heads=8, vocab=32000, seq=512, batch=4),
    # For a GPU (--device cuda): about 250M parameters.
    "gpu": dict(dim=1024, layers=16, heads=16, vocab=32000, seq=1024, batch=16),
    # The two shapes of issue 17's GPU comparison (H100, bf16): 134M and 886M parameters.
    "s1": dict(dim=768, layers=12, heads=12, vocab=32000, seq=1024, batch=16),
    "s2": dict(dim=2048, layers=16, heads=16, kv=8, vocab=32000, seq=2048, batch=4),
    # A sliding window an eighth of the sequence (Mistral's and Gemma's layers): tide
    # attends in blocks that leave out what the window does; PyTorch's attention takes no
    # window, so its peers pass the window's [T, T] mask.
    "window": dict(dim=256, layers=4, heads=4, kv=2, vocab=8192, seq=2048, batch=2, window=256),
    # A long sequence, where activations outgrow the weights: what context parallelism is for.
    "long": dict(dim=256, layers=4, heads=4, kv=2, vocab=8192, seq=8192, batch=2),
    # recipes/mixtral/mixtral-tiny.lua: every MLP 8 SwiGLU experts of 256, 2 a token.
    "moe": dict(dim=256, layers=4, heads=4, kv=2, vocab=8192, seq=256, batch=8, experts=8, top_k=2, expert_ffn=256),
}


def expert_sets(s):
    """The recipe fields of a mixture-of-experts shape (none for a dense one)."""
    if not s.get("experts"):
        return {}
    return {"model.moe_experts": s["experts"], "model.moe_top_k": s["top_k"], "model.ffn_dim": s["expert_ffn"]}


def overrides(shape, data, steps, **more):
    """`--set` arguments for RECIPE: the shape, the data, `steps` steps without warmup or
    evaluation, plus `more` (dotted field names with "." written as "__")."""
    s = SHAPES[shape]
    sets = {
        "model.vocab_size": s["vocab"], "model.dim": s["dim"], "model.n_layers": s["layers"],
        "model.n_heads": s["heads"], "model.n_kv_heads": s.get("kv", 0), "model.multiple_of": 256,
        "model.max_seq_len": s["seq"], "data.seq_len": s["seq"], "data.path": data,
        "batch.micro_batch": s["batch"], "batch.global_batch": s["batch"], "schedule.steps": steps,
        "schedule.warmup_steps": 0, "eval.every": 0, "log_every": 1000,
        "model.sliding_window": s.get("window", 0),
        **expert_sets(s),
    }
    sets.update({k.replace("__", "."): v for k, v in more.items()})
    return [arg for k, v in sets.items() for arg in ("--set", f"{k}={v}")]
