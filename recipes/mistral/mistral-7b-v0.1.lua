-- Mistral 7B v0.1: LLaMA's architecture with grouped-query attention over a sliding
-- window of 4096 tokens (Jiang et al. 2023; Hugging Face config.json sliding_window
-- 4096, max_position_embeddings 32768). At data.seq_len = 4096 the window covers every
-- sequence and costs nothing; longer sequences attend within it. Validates and reports
-- its parameter count here; training it needs a GPU cluster and a layout for it
-- (parallel.dp, tp, pp, zero; docs/parallelism.md). Fine-tuning the published weights:
-- `tide convert import` them and set checkpoint.init_from (docs/checkpoints.md).
return tide.recipe {
  name = "mistral-7b-v0.1",
  model = tide.models.llama {
    vocab_size = 32000,
    dim = 4096,
    n_layers = 32,
    n_heads = 32,
    n_kv_heads = 8,
    ffn_dim = 14336,
    rope_theta = 10000,
    max_seq_len = 32768,
    sliding_window = 4096,
  },
  data = { path = "data/mistral-7b", seq_len = 4096 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-5, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 1, pp = 1, zero = 1 },
}
