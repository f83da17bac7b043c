"""PyTorch-eager LLaMA training step, the peer of `tide train` in bench/train_vs_pytorch.py.

The model is the usual eager implementation (RMSNorm, rotary embeddings in the HF
rotate-half form, SwiGLU, causal softmax attention, grouped-query with --kv-heads, untied
output), trained with torch.optim.AdamW on windows of the same token file tide reads: in
fp32, or with --bf16 under bf16 autocast (fp32 weights and optimizer state); --sdpa
attends through F.scaled_dot_product_attention and --fused-adamw uses AdamW(fused=True),
the best eager setup for a GPU. --window W lets a query see only the W nearest keys, through
the window's [T, T] mask (PyTorch's attention takes no window). --lora R trains LoRA
adapters of rank R (lora_alpha 16, no dropout) on the seven projections of every block
through PEFT (inject_adapter_in_model), every other weight frozen, as a PEFT user does.
--experts E --top-k K --expert-ffn F makes every MLP a mixture of E SwiGLU experts of width
F, K a token, written as transformers' Mixtral block is (a softmax router, the chosen
probabilities normalised, a loop over the experts gathering each one's tokens), with the
Switch load-balancing loss (0.01 E sum_e f_e P_e a block, summed) added to the loss, as
tide's model.moe_aux_loss does.
Run with .venv/bin/python (the PyTorch whose LibTorch tide links).
"""
import argparse
import json
import math
import resource
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def ffn_dim(dim, multiple_of):
    hidden = int(2 * (4 * dim) / 3)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim, n_heads, kv_heads, sdpa):
        super().__init__()
        self.h, self.kv, self.hd, self.sdpa = n_heads, kv_heads, dim // n_heads, sdpa
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x, cos, sin, mask):
        b, t, d = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if self.sdpa:
            # mask: a window's (True: may attend), else None for the causal kernel.
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                               enable_gqa=self.kv != self.h)
        else:
            if self.kv != self.h:
                k = k.repeat_interleave(self.h // self.kv, 1)
                v = v.repeat_interleave(self.h // self.kv, 1)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(self.hd)
            att = att.masked_fill(mask, float("-inf")).softmax(-1)
            y = att @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, dim, ffn):
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn, bias=False)
        self.up_proj = nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)

    def forward(self, h):
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Experts(nn.Module):
    """transformers' MixtralSparseMoeBlock, plus the block's Switch balance loss."""
    def __init__(self, dim, ffn, experts, top_k):
        super().__init__()
        self.gate = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList([SwiGLU(dim, ffn) for _ in range(experts)])
        self.top_k = top_k

    def forward(self, h):
        shape = h.shape
        h = h.reshape(-1, shape[-1])
        probs = F.softmax(self.gate(h), dim=1, dtype=torch.float)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(h.dtype)
        out = torch.zeros_like(h)
        mask = F.one_hot(chosen, num_classes=len(self.experts)).permute(2, 1, 0)  # [E, k, N]
        for e, expert in enumerate(self.experts):
            slot, token = torch.where(mask[e])
            out.index_add_(0, token, (expert(h[token]) * weights[token, slot, None]).to(h.dtype))
        share = mask.sum(dim=(1, 2)).float() / (h.shape[0] * self.top_k)
        balance = len(self.experts) * (share * probs.mean(0)).sum()
        return out.reshape(shape), balance


class Block(nn.Module):
    def __init__(self, dim, n_heads, kv_heads, ffn, sdpa, experts=0, top_k=2):
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = Attention(dim, n_heads, kv_heads, sdpa)
        self.post_attention_layernorm = RMSNorm(dim)
        self.mlp = Experts(dim, ffn, experts, top_k) if experts else SwiGLU(dim, ffn)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        y = self.mlp(self.post_attention_layernorm(x))
        if isinstance(y, tuple):
            y, balance = y
            self.balance = balance
        return x + y


class Llama(nn.Module):
    def __init__(self, vocab, dim, layers, heads, kv_heads, ffn, seq, sdpa, window=0, experts=0, top_k=2):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([Block(dim, heads, kv_heads, ffn, sdpa, experts, top_k) for _ in range(layers)])
        self.experts = experts
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        hd = dim // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
        ang = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
        emb = torch.cat((ang, ang), -1)
        self.register_buffer("cos", emb.cos().float(), persistent=False)
        self.register_buffer("sin", emb.sin().float(), persistent=False)
        # True where a query may not look: the future, and with a window all but its w nearest.
        masked = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
        if window:
            masked |= torch.tril(torch.ones(seq, seq, dtype=torch.bool), -window)
        self.register_buffer("mask", masked, persistent=False)
        # SDPA's: True where a query may attend; none for plain causal attention.
        self.sdpa, self.window = sdpa, window
        self.register_buffer("allowed", masked.logical_not(), persistent=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, tokens, targets):
        t = tokens.shape[1]
        x = self.embed_tokens(tokens)
        cos, sin = self.cos[:t], self.sin[:t]
        if self.sdpa:
            mask = self.allowed[:t, :t] if self.window else None
        else:
            mask = self.mask[:t, :t]
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        logits = self.lm_head(self.norm(x))
        loss = F.cross_entropy(logits.view(-1, logits.shape[-1]).float(), targets.reshape(-1))
        if self.experts:
            loss = loss + 0.01 * sum(layer.balance for layer in self.layers)
        return loss


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True, help="train.bin of a tide dataset (uint16)")
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--kv-heads", type=int, default=0, help="key/value heads (0: as many as --heads)")
    ap.add_argument("--vocab", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--multiple-of", type=int, default=256)
    ap.add_argument("--window", type=int, default=0, help="sliding window of keys a query sees (0: none)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (fp32 weights and optimizer state)")
    ap.add_argument("--sdpa", action="store_true", help="attention through F.scaled_dot_product_attention")
    ap.add_argument("--fused-adamw", action="store_true", help="torch.optim.AdamW(fused=True)")
    ap.add_argument("--lora", type=int, default=0, help="LoRA adapters of this rank through PEFT (0: full training)")
    ap.add_argument("--experts", type=int, default=0, help="a mixture of this many experts in every block (0: none)")
    ap.add_argument("--top-k", type=int, default=2, help="experts a token (with --experts)")
    ap.add_argument("--expert-ffn", type=int, default=0, help="each expert's width (with --experts)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model (inductor); the warm-up steps take the compilation")
    a = ap.parse_args()
    cuda = a.device == "cuda"

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    tokens = np.memmap(a.data, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(0)
    ffn = a.expert_ffn if a.experts else ffn_dim(a.dim, a.multiple_of)
    model = Llama(a.vocab, a.dim, a.layers, a.heads, a.kv_heads or a.heads, ffn, a.seq, a.sdpa, a.window,
                  a.experts, a.top_k).to(a.device)
    if a.lora:
        from peft import LoraConfig, inject_adapter_in_model
        targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        model = inject_adapter_in_model(LoraConfig(r=a.lora, lora_alpha=16, lora_dropout=0.0,
                                                   target_modules=targets), model)
        for name, p in model.named_parameters():
            p.requires_grad_("lora_" in name)
    trained = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in trained if p.dim() > 1 and p is not model.embed_tokens.weight]
    rest = [p for p in trained if not (p.dim() > 1 and p is not model.embed_tokens.weight)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=a.fused_adamw or None)
    forward = torch.compile(model) if a.compile else model
    times = []
    for step in range(a.warmup + a.steps):
        starts = rng.integers(0, len(tokens) - a.seq - 1, size=a.batch)
        window = torch.from_numpy(np.stack([tokens[s:s + a.seq + 1].astype(np.int64) for s in starts]))
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        window = window.to(a.device, non_blocking=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.bf16):
            loss = forward(window[:, :-1], window[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        opt.step()
        if cuda:
            torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        if step >= a.warmup:
            times.append(dt)
    tokens_per_step = a.batch * a.seq
    print(json.dumps({
        "tokens_per_second": tokens_per_step * len(times) / sum(times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "peak_device_mb": torch.cuda.max_memory_allocated() / 1e6 if cuda else None,
        "final_loss": float(loss),
        "parameters": sum(p.numel() for p in model.parameters()),
        "trained": sum(p.numel() for p in trained),
    }))


if __name__ == "__main__":
    main()
