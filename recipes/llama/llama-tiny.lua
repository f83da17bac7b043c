-- A small LLaMA (rotary positions, RMSNorm, SwiGLU, grouped-query attention) that
-- learns the bundled King James Bible corpus in a few minutes on two CPU cores.
-- `make demo` prepares data/kjv and trains this recipe.
return tide.recipe {
  name = "llama-tiny",
  seed = 1234,
  model = tide.models.llama {
    vocab_size = 8192,
    dim = 256,
    n_layers = 4,
    n_heads = 4,
    n_kv_heads = 2,
    multiple_of = 64,
    max_seq_len = 256,
  },
  data = { path = "data/kjv", seq_len = 256 },
  batch = { micro_batch = 8, global_batch = 8 },
  optimizer = { lr = 2e-3, weight_decay = 0.1, grad_clip = 1.0, beta2 = 0.99 },
  schedule = { steps = 250, warmup_steps = 20, decay = "cosine", min_lr = 1e-4 },
  eval = { every = 50, batches = 8 },
  log_every = 5,
}
