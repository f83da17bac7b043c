-- Gemma 2B: LLaMA's architecture with a GeGLU MLP (gelu's tanh form gates it), RMSNorms
-- that multiply by 1 + weight, tied embeddings scaled by sqrt(dim), one key/value head
-- and heads of 256 (Gemma technical report, 2024; Hugging Face config.json of
-- google/gemma-2b). Validates and reports its parameter count here; training it needs a
-- GPU and a layout for it (docs/parallelism.md). Its tokenizer.model (SentencePiece,
-- 256,000 pieces) prepares data: `tide data prepare --tokenizer`.
return tide.recipe {
  name = "gemma-2b",
  model = tide.models.gemma {
    vocab_size = 256000,
    dim = 2048,
    n_layers = 18,
    n_heads = 8,
    n_kv_heads = 1,
    head_dim = 256,
    ffn_dim = 16384,
    max_seq_len = 8192,
  },
  data = { path = "data/gemma-2b", seq_len = 8192 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 1, pp = 1, zero = 1 },
}
