-- LLaMA-3 70B: the published shape (Touvron et al. / Meta model card). Validates and reports
-- its parameter count here; training it needs a GPU cluster
-- and a layout for it (parallel.dp, tp, pp, zero; docs/parallelism.md).
return tide.recipe {
  name = "llama-3-70b",
  model = tide.models.llama {
    vocab_size = 128256,
    dim = 8192,
    n_layers = 80,
    n_heads = 64,
    n_kv_heads = 8,
    ffn_dim_multiplier = 1.3,
    multiple_of = 4096,
    rope_theta = 500000,
    max_seq_len = 8192,
  },
  data = { path = "data/llama-3-70b", seq_len = 8192 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 1.5e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-5, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 500000, warmup_steps = 2000, decay = "cosine", min_lr = 1.5e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 8, pp = 4, zero = 1 },
}
