-- Mistral NeMo 12B (Mistral AI and NVIDIA, 2024): 40 layers at dim 5120 with 32 query and
-- 8 key/value heads of 128, so attention is 4096 wide (model.head_dim), RoPE base 10^6
-- and a 128K context (Hugging Face config.json of mistralai/Mistral-Nemo-Base-2407; no
-- sliding window). Validates and reports its parameter count here; training it needs a
-- GPU cluster and a layout for it (docs/parallelism.md).
return tide.recipe {
  name = "mistral-nemo-12b",
  model = tide.models.llama {
    vocab_size = 131072,
    dim = 5120,
    n_layers = 40,
    n_heads = 32,
    n_kv_heads = 8,
    head_dim = 128,
    ffn_dim = 14336,
    rope_theta = 1000000,
    max_seq_len = 131072,
  },
  data = { path = "data/mistral-nemo-12b", seq_len = 8192 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-5, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 1, pp = 1, zero = 1 },
}
