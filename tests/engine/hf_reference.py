#!/usr/bin/env python3
"""The Hugging Face side of tide's parity tests (tests/engine/hf_reference_model_test.cpp).

  hf_reference.py make DIR [NAME...]
                               random tiny LlamaForCausalLM and BloomForCausalLM (fixed seed),
                               saved by transformers in DIR/llama and DIR/bloom (and the
                               LLaMA shape with RoPE scaling: DIR/llama3, Llama 3.1's
                               scaling, DIR/llama_linear and DIR/llama_yarn; MistralForCausalLM in
                               DIR/mistral; Qwen2ForCausalLM, biases on q, k and v, in
                               DIR/qwen2; with sliding windows of 6 and 5 tokens, shorter
                               than the inputs, DIR/mistral_window and DIR/qwen2_window;
                               with heads of 16 at hidden_size 32, DIR/mistral_wide_heads;
                               Qwen3ForCausalLM, query/key norms, in DIR/qwen3;
                               GemmaForCausalLM, GeGLU and zero-centred norms, in DIR/gemma;
                               Gemma2ForCausalLM, post-norms, soft-capped scores and logits,
                               a windowed and a full layer, in DIR/gemma2;
                               Gemma3ForCausalLM, post-norms and a scale of its own, every
                               layer in full in DIR/gemma3, every layer over a window of 5
                               in DIR/gemma3_window, layers of both kinds, each with its
                               RoPE, in DIR/gemma3_mixed, and that language model in a
                               Gemma3ForConditionalGeneration with a vision tower, in
                               DIR/gemma3_multimodal; Qwen2 whose first layer attends in
                               full and second over a window, DIR/qwen2_mixed;
                               MixtralForCausalLM in DIR/mixtral and Qwen3MoeForCausalLM
                               (unnormalised top-k probabilities) in DIR/qwen3_moe;
                               Qwen2MoeForCausalLM (a gated shared expert beside the routed
                               ones, biases on q, k and v) in DIR/qwen2_moe; only the
                               NAMEs given, where any are: all are drawn, in one order),
                               each with
                               reference.safetensors: input_ids [2, T] (int64), their logits
                               [2, T, V] (fp32), greedy [N] (int64): transformers' greedy
                               continuation of input_ids[0], N new tokens, and greedy_margin [1]:
                               the smallest lead of a chosen token's logit over the next
  hf_reference.py logits HF_DIR OUT
                               loads HF_DIR (a tide export) with AutoModelForCausalLM and
                               writes OUT like reference.safetensors, for the ids it finds in OUT

Runs with the project's .venv (transformers, torch, safetensors; scripts/setup.sh).
"""
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, BloomConfig, BloomForCausalLM, Gemma2Config, Gemma2ForCausalLM,
                          Gemma3Config, Gemma3ForCausalLM, Gemma3ForConditionalGeneration, Gemma3TextConfig, GemmaConfig, GemmaForCausalLM, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM, SiglipVisionConfig)

NEW_TOKENS = 12


def reference(model, input_ids):
    model.eval()
    with torch.no_grad():
        logits = model(input_ids).logits.float().contiguous()
        out = model.generate(input_ids[:1], max_new_tokens=NEW_TOKENS, do_sample=False, num_beams=1,
                             pad_token_id=0, eos_token_id=None, output_scores=True, return_dict_in_generate=True)
    greedy = out.sequences[0, input_ids.shape[1]:]
    # The smallest lead of the chosen token over the next one, over every greedy step: a
    # rounding difference smaller than this cannot change the continuation.
    top2 = torch.stack([s[0].float().topk(2).values for s in out.scores])
    margin = (top2[:, 0] - top2[:, 1]).min().reshape(1)
    return {"input_ids": input_ids.contiguous(), "logits": logits, "greedy": greedy.contiguous(),
            "greedy_margin": margin}


def make(out, names):
    torch.manual_seed(0)
    # initializer_range 0.2 (not HF's 0.02): logits far enough apart that greedy choices are
    # not near-ties that rounding could flip.
    shape = dict(vocab_size=97, hidden_size=32, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, rope_theta=10000.0,
                 tie_word_embeddings=False, initializer_range=0.2, attn_implementation="eager")

    def llama(**rope):
        return LlamaForCausalLM(LlamaConfig(**shape, **rope))

    models = {
        "llama": llama(),
        "bloom": BloomForCausalLM(BloomConfig(
            vocab_size=97, hidden_size=24, n_layer=2, n_head=6, layer_norm_epsilon=1e-5,
            initializer_range=0.2, attn_implementation="eager")),
    }
    # Scaled RoPE: a pretrained context of 16 tokens (the inputs' length), so that with a head
    # dimension of 8 (wavelengths 6.3 to 6283 tokens) llama3 scaling keeps none of the
    # frequencies as they were: one is blended, three are divided by the factor.
    models["llama3"] = llama(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                           "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    models["llama_linear"] = llama(rope_scaling={"rope_type": "linear", "factor": 4.0})
    # YaRN over the same 16 tokens: beta_slow 0.01 puts the ramp's end at dimension 3 of
    # the 4 frequencies, so one is kept, two blended (1/3, 2/3) and one divided; the
    # attention factor is the derived 0.1 ln 4 + 1.
    models["llama_yarn"] = llama(rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_slow": 0.01,
                                               "original_max_position_embeddings": 16})
    torch.manual_seed(1)  # seed 0's draw has a near-tie in its greedy continuation (greedy_margin)
    models["mistral"] = MistralForCausalLM(MistralConfig(sliding_window=None, **shape))
    models["qwen2"] = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=False, **shape))
    models["mistral_window"] = MistralForCausalLM(MistralConfig(sliding_window=6, **shape))
    models["qwen2_window"] = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, sliding_window=5,
                                                          max_window_layers=0, **shape))
    # Layer 0 in full, layer 1 over the window (Qwen's max_window_layers).
    models["qwen2_mixed"] = Qwen2ForCausalLM(Qwen2Config(use_sliding_window=True, sliding_window=5,
                                                         max_window_layers=1, **shape))
    # Mistral NeMo's shape: heads wider than hidden_size / num_attention_heads (16, not 8).
    models["mistral_wide_heads"] = MistralForCausalLM(MistralConfig(sliding_window=None, head_dim=16, **shape))
    # Qwen3: query/key norms over heads of 16 (their weights drawn around 1: transformers
    # starts them at 1, where a lost one would not show).
    models["qwen3"] = Qwen3ForCausalLM(Qwen3Config(head_dim=16, **shape))
    with torch.no_grad():
        for name, p in models["qwen3"].named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.normal_(1, 0.2)
    # Gemma: a GeGLU MLP, norms multiplying by 1 + weight (drawn around 0: transformers
    # starts them at 0, where a lost 1 + would not show), embeddings scaled by sqrt(32) and
    # tied, heads of 16.
    gemma_shape = dict(shape, tie_word_embeddings=True)
    models["gemma"] = GemmaForCausalLM(GemmaConfig(head_dim=16, hidden_act="gelu_pytorch_tanh", **gemma_shape))
    with torch.no_grad():
        for name, p in models["gemma"].named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(0, 0.2)
    with torch.no_grad():  # transformers starts biases at zero, where a lost one would not show
        for family in ("qwen2", "qwen2_window", "qwen2_mixed"):
            for name, p in models[family].named_parameters():
                if name.endswith(".bias"):
                    p.normal_(0, 0.2)
    # Gemma 3: post-norms, query/key norms, scores scaled by 24^-1/2 (not the head's 16),
    # every layer in full; and every layer over a window of 5 with the local RoPE base
    # (1000, where the full layers' would be 10^6).
    gemma3_shape = dict(gemma_shape, head_dim=16, query_pre_attn_scalar=24, hidden_activation="gelu_pytorch_tanh")
    models["gemma3"] = Gemma3ForCausalLM(Gemma3TextConfig(layer_types=["full_attention"] * 2, **gemma3_shape))
    models["gemma3_window"] = Gemma3ForCausalLM(Gemma3TextConfig(
        **dict(gemma3_shape, rope_theta=1e6), layer_types=["sliding_attention"] * 2, sliding_window=5,
        rope_local_base_freq=1000.0))
    # Gemma 3's two kinds of layer: layer 0 over a window of 5 with the local base 1000,
    # unscaled; layer 1 in full with the base 10^6 and linear RoPE scaling (Gemma 3 4B's
    # kind, factor 8 there).
    models["gemma3_mixed"] = Gemma3ForCausalLM(Gemma3TextConfig(
        **dict(gemma3_shape, rope_theta=1e6), layer_types=["sliding_attention", "full_attention"], sliding_window=5,
        rope_local_base_freq=1000.0, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    # Gemma 2: post-norms, scores scaled by 24^-1/2, layer 0 over a window of 5 and layer 1
    # in full, attention's scores capped at 1 and the logits at 3 (Gemma 2's are 50 and 30:
    # here caps the tiny model's scores and logits reach).
    models["gemma2"] = Gemma2ForCausalLM(Gemma2Config(
        **dict(gemma_shape, head_dim=16, query_pre_attn_scalar=24, hidden_activation="gelu_pytorch_tanh"),
        layer_types=["sliding_attention", "full_attention"], sliding_window=5, attn_logit_softcapping=1.0,
        final_logit_softcapping=3.0))
    # Gemma 3 4B and larger ship as Gemma3ForConditionalGeneration: gemma3_mixed's language
    # model beside a vision tower and projector (tiny SigLIP), its config under text_config.
    models["gemma3_multimodal"] = Gemma3ForConditionalGeneration(Gemma3Config(
        text_config=models["gemma3_mixed"].config.to_dict(),
        vision_config=SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, image_size=16, patch_size=8).to_dict(),
        mm_tokens_per_image=4, attn_implementation="eager"))
    with torch.no_grad():
        for family in ("gemma2", "gemma3", "gemma3_window", "gemma3_mixed", "gemma3_multimodal"):
            for name, p in models[family].named_parameters():
                if name.endswith("norm.weight"):
                    p.normal_(0, 0.2)
    # Mixtures of experts, drawn after the rest: Mixtral (4 experts of 96, 2 a token, their
    # probabilities normalised) and Qwen3-MoE (query/key norms, heads of 16, experts of 48,
    # the softmax's probabilities as they are: norm_topk_prob false). Drawn last, so that
    # every model before them keeps its draw. A router's near-tie between a token's k-th
    # and next expert, which rounding could flip, would show as logits apart, not pass.
    moe = dict(num_experts_per_tok=2, router_aux_loss_coef=0.01)
    models["mixtral"] = MixtralForCausalLM(MixtralConfig(num_local_experts=4, sliding_window=None, **moe, **shape))
    models["qwen3_moe"] = Qwen3MoeForCausalLM(Qwen3MoeConfig(
        num_experts=4, moe_intermediate_size=48, norm_topk_prob=False, head_dim=16, decoder_sparse_step=1,
        mlp_only_layers=[], **moe, **shape))
    with torch.no_grad():
        for name, p in models["qwen3_moe"].named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.normal_(1, 0.2)
    # Qwen2-MoE, drawn after them: 4 experts of 48 and a shared expert of 64 whose output a
    # sigmoid gates per token, the softmax's probabilities as they are, biases on q, k and v
    # (drawn: they start at zero).
    models["qwen2_moe"] = Qwen2MoeForCausalLM(Qwen2MoeConfig(
        num_experts=4, moe_intermediate_size=48, shared_expert_intermediate_size=64, norm_topk_prob=False,
        qkv_bias=True, decoder_sparse_step=1, mlp_only_layers=[], **moe, **shape))
    with torch.no_grad():
        for name, p in models["qwen2_moe"].named_parameters():
            if name.endswith("_proj.bias"):
                p.normal_(0, 0.2)
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, 97, (2, 16), generator=g)
    # Every model is drawn (each draw follows the ones before it: the seeds above chose
    # continuations without near-ties), the named ones saved and run.
    unknown = set(names) - set(models)
    if unknown:
        sys.exit(f"hf_reference.py make: no model {sorted(unknown)}; there are {sorted(models)}")
    for family, model in models.items():
        if names and family not in names:
            continue
        d = os.path.join(out, family)
        model.save_pretrained(d, safe_serialization=True)
        save_file(reference(model, input_ids), os.path.join(d, "reference.safetensors"))


def logits(hf_dir, out):
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    save_file(reference(model, load_file(out)["input_ids"]), out)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3:])
    elif len(sys.argv) == 4 and sys.argv[1] == "logits":
        logits(sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
