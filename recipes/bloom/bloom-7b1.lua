-- BLOOM-7B1: the published shape (BigScience model card). Validates and reports its
-- parameter count here; training it needs a GPU cluster
-- and a layout for it (parallel.dp, tp, pp, zero; docs/parallelism.md).
return tide.recipe {
  name = "bloom-7b1",
  model = tide.models.bloom {
    vocab_size = 250880,
    dim = 4096,
    n_layers = 30,
    n_heads = 32,
    max_seq_len = 2048,
  },
  data = { path = "data/bloom-7b1", seq_len = 2048 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 6e-5, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 100000, warmup_steps = 375, decay = "cosine", min_lr = 6e-6 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 4, pp = 1, zero = 1 },
}
