-- Qwen1.5-MoE-A2.7B: Qwen2's attention (16 heads of 128, biases on q, k and v) with every
-- block's MLP a mixture of 60 SwiGLU experts of width 1408, 4 a token, their router
-- probabilities as the softmax gives them, beside a shared expert of width 5632 that
-- every token goes through, its output gated per token by a sigmoid (Hugging Face
-- config.json of Qwen/Qwen1.5-MoE-A2.7B, model_type qwen2_moe): 14.3B parameters, 2.7B
-- of them used by each token. Validates and reports its parameter count here; training it
-- needs a GPU cluster: each group of 4 data-parallel ranks holds 15 experts of every block
-- a rank (parallel.ep), so dp must be a multiple of 4. Its tokenizer.json (NFC,
-- byte-level BPE) prepares data: `tide data prepare --tokenizer`.
return tide.recipe {
  name = "qwen1.5-moe-a2.7b",
  model = tide.models.llama {
    vocab_size = 151936,
    dim = 2048,
    n_layers = 24,
    n_heads = 16,
    n_kv_heads = 16,
    ffn_dim = 1408,
    qkv_bias = true,
    moe_experts = 60,
    moe_top_k = 4,
    moe_normalize_top_k = false,
    moe_shared_ffn_dim = 5632,
    moe_shared_gate = true,
    moe_aux_loss = 0.001,
    norm_eps = 1e-6,
    rope_theta = 1000000,
    max_seq_len = 8192,
  },
  data = { path = "data/qwen1.5-moe-a2.7b", seq_len = 4096 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { zero = 1, ep = 4 },
}
