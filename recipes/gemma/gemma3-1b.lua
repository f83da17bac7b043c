-- Gemma 3 1B (text): Gemma's architecture with norms after attention and the MLP too,
-- query/key norms, one key/value head, heads of 256, and five layers attending over a
-- sliding window of 512 tokens (RoPE base 10^4) for every one attending in full (base
-- 10^6): layers 5, 11, 17 and 23 (Gemma 3 technical report, 2025; Hugging Face
-- config.json of google/gemma-3-1b-pt). Validates and reports its parameter count here;
-- training it needs a GPU. Its tokenizer (262,144 pieces) prepares data:
-- `tide data prepare --tokenizer`.
return tide.recipe {
  name = "gemma3-1b",
  model = tide.models.gemma3 {
    vocab_size = 262144,
    dim = 1152,
    n_layers = 26,
    n_heads = 4,
    n_kv_heads = 1,
    head_dim = 256,
    ffn_dim = 6912,
    max_seq_len = 32768,
    sliding_window = 512,
  },
  data = { path = "data/gemma3-1b", seq_len = 32768 },
  batch = { micro_batch = 1, global_batch = 256 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 1, pp = 1, zero = 1 },
}
