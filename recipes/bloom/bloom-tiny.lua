-- A small BLOOM (ALiBi, LayerNorm everywhere, GELU, fused per-head QKV, tied
-- embeddings) on the bundled corpus.
return tide.recipe {
  name = "bloom-tiny",
  seed = 1234,
  model = tide.models.bloom {
    vocab_size = 8192,
    dim = 256,
    n_layers = 4,
    n_heads = 4,
    max_seq_len = 256,
  },
  data = { path = "data/kjv", seq_len = 256 },
  batch = { micro_batch = 8, global_batch = 8 },
  optimizer = { lr = 1e-3, weight_decay = 0.1, grad_clip = 1.0, beta2 = 0.99 },
  schedule = { steps = 250, warmup_steps = 20, decay = "cosine", min_lr = 1e-4 },
  eval = { every = 50, batches = 8 },
  log_every = 5,
}
