-- LLaMA-2 13B: the published shape (Touvron et al. / Meta model card). Validates and reports
-- its parameter count here; training it needs a GPU cluster
-- and a layout for it (parallel.dp, tp, pp, zero; docs/parallelism.md).
return tide.recipe {
  name = "llama-2-13b",
  model = tide.models.llama {
    vocab_size = 32000,
    dim = 5120,
    n_layers = 40,
    n_heads = 40,
    n_kv_heads = 40,
    multiple_of = 256,
    rope_theta = 10000,
    max_seq_len = 4096,
  },
  data = { path = "data/llama-2-13b", seq_len = 4096 },
  batch = { micro_batch = 1, global_batch = 1024 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-5, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 500000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 2, pp = 1, zero = 1 },
}
