#!/usr/bin/env python3
"""The PEFT side of tide's LoRA reference test (tests/engine/lora_test.cpp).

  hf_lora.py make DIR   a random tiny LlamaForCausalLM and BloomForCausalLM (fixed seed)
                        with PEFT LoRA adapters of rank 4 and alpha 8 on every block
                        projection, B drawn at random (PEFT starts it at zero, where the
                        update would not show), in DIR/llama and DIR/bloom: base/ (the base
                        model, save_pretrained), adapter/ (PeftModel.save_pretrained:
                        adapter_config.json, adapter_model.safetensors) and
                        reference.safetensors: input_ids [2, T + 1] (int64), logits
                        [2, T, V] of input_ids[:, :-1] (fp32), loss [1], the mean next-token
                        cross-entropy against input_ids[:, 1:], and for every adapter matrix
                        its gradient of that loss, "grad|" + its name in tide
                        ("grad|model.layers.0.self_attn.q_proj.lora_A.weight").
  hf_lora.py merged BASE ADAPTER MERGED
                        loads the Hugging Face directory BASE with AutoModelForCausalLM and
                        the PEFT adapter directory ADAPTER onto it (PeftModel.from_pretrained),
                        and MERGED (the same model with the adapters merged) alone; exits 0
                        when their logits on random ids agree within the fp32 bound of two
                        summation orders (tests/engine/hf_reference.h: logit_tolerance)

Runs with the project's .venv (transformers, peft, torch, safetensors; scripts/setup.sh).
"""
import os
import sys

import torch
import math

from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, BloomConfig, BloomForCausalLM, LlamaConfig, LlamaForCausalLM

RANK, ALPHA = 4, 8
TARGETS = {
    "llama": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "bloom": ["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"],
}
PEFT_PREFIX = "base_model.model."


def models():
    torch.manual_seed(0)
    return {
        "llama": LlamaForCausalLM(LlamaConfig(
            vocab_size=97, hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
            tie_word_embeddings=False, initializer_range=0.2, attn_implementation="eager")),
        "bloom": BloomForCausalLM(BloomConfig(
            vocab_size=97, hidden_size=24, n_layer=2, n_head=6, layer_norm_epsilon=1e-5, initializer_range=0.2,
            attn_implementation="eager")),
    }


def make(out):
    for family, base in models().items():
        d = os.path.join(out, family)
        base.save_pretrained(os.path.join(d, "base"))
        model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                target_modules=TARGETS[family], bias="none"))
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.2)
        model.save_pretrained(os.path.join(d, "adapter"))
        torch.manual_seed(1)
        ids = torch.randint(0, base.config.vocab_size, (2, 13))
        model.train()
        logits = model(input_ids=ids[:, :-1]).logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        loss.backward()
        ref = {"input_ids": ids.contiguous(), "logits": logits.detach().contiguous(), "loss": loss.detach().reshape(1)}
        for name, p in model.named_parameters():
            if "lora_" not in name:
                assert p.grad is None, name
                continue
            tide_name = name[len(PEFT_PREFIX):].replace(".default.", ".")
            ref["grad|" + tide_name] = p.grad.detach().contiguous()
        save_file(ref, os.path.join(d, "reference.safetensors"))


def merged(base_dir, adapter_dir, merged_dir):
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_dir), adapter_dir).eval()
    model = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    cfg = model.config
    torch.manual_seed(2)
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    with torch.no_grad():
        a, b = adapted(ids).logits, model(ids).logits
        with adapted.disable_adapter():
            plain = adapted(ids).logits
    # logit_tolerance: D = 4 L + 2 sums of at most K terms each, K u sqrt(K) apart apiece.
    hidden = getattr(cfg, "hidden_size")
    ffn = getattr(cfg, "intermediate_size", 4 * hidden)
    K = max(hidden, ffn, ids.shape[1])
    D = 4 * cfg.num_hidden_layers + 2
    bound = D * K * 2.0 ** -24 * math.sqrt(K) * b.abs().max().item()
    worst = (a - b).abs().max().item()
    print(f"  peft(base + adapter) against the merged model: logits within {worst:.2e} (bound {bound:.2e})")
    # The base alone lies farther off: the comparison sees the adapters.
    apart = (plain - b).abs().max().item()
    print(f"  the base without the adapter: {apart:.2e} off")
    return worst <= bound < apart


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "make":
        make(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "merged":
        sys.exit(0 if merged(*sys.argv[2:5]) else 1)
    else:
        sys.exit(__doc__)
