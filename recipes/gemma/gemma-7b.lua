-- Gemma 7B: Gemma 2B's architecture (tide.models.gemma) at dim 3072 with 16 heads of 256,
-- so attention is 4096 wide, and full multi-head attention (Gemma technical report,
-- 2024; Hugging Face config.json of google/gemma-7b). Validates and reports its
-- parameter count here; training it needs a GPU cluster and a layout for it
-- (docs/parallelism.md).
return tide.recipe {
  name = "gemma-7b",
  model = tide.models.gemma {
    vocab_size = 256000,
    dim = 3072,
    n_layers = 28,
    n_heads = 16,
    n_kv_heads = 16,
    head_dim = 256,
    ffn_dim = 24576,
    max_seq_len = 8192,
  },
  data = { path = "data/gemma-7b", seq_len = 8192 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 1, pp = 1, zero = 1 },
}
