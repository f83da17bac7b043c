-- Mixtral 8x7B: Mistral 7B's attention (32 query and 8 key/value heads, RoPE base 10^6)
-- with every block's MLP a mixture of 8 SwiGLU experts of width 14336, each token sent
-- to 2 (Mistral AI's paper, Jiang et al. 2024; Hugging Face config.json of
-- mistralai/Mixtral-8x7B-v0.1): 46.7B parameters, 12.9B of them used by each token.
-- Validates and reports its parameter count here; training it needs a GPU cluster: each
-- group of 8 data-parallel ranks holds one expert of every block a rank (parallel.ep, as
-- Megatron-Core trains Mixtral), ZeRO-3 shards the rest, so dp must be a multiple of 8.
return tide.recipe {
  name = "mixtral-8x7b",
  model = tide.models.llama {
    vocab_size = 32000,
    dim = 4096,
    n_layers = 32,
    n_heads = 32,
    n_kv_heads = 8,
    ffn_dim = 14336,
    moe_experts = 8,
    moe_top_k = 2,
    moe_aux_loss = 0.01,
    rope_theta = 1000000,
    max_seq_len = 32768,
  },
  data = { path = "data/mixtral-8x7b", seq_len = 4096 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { zero = 3, ep = 8 },
}
