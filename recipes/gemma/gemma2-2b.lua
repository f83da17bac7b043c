-- Gemma 2 2B: Gemma's architecture with norms after attention and the MLP too, attention
-- scores soft-capped at 50 and logits at 30, and layers that alternate between a sliding
-- window of 4096 tokens (the even ones) and full attention (the odd ones), heads of 256
-- (Gemma 2 technical report, 2024; Hugging Face config.json of google/gemma-2-2b).
-- Validates and reports its parameter count here; training it needs GPUs and a layout for
-- them (`tide plan` on 8 H100s fits this layout). Soft-capped attention runs a block of
-- queries at a time in LibTorch ops (no fused kernel takes a cap). Its tokenizer.model
-- (SentencePiece, 256,000 pieces) prepares data: `tide data prepare --tokenizer`.
return tide.recipe {
  name = "gemma2-2b",
  model = tide.models.gemma2 {
    vocab_size = 256000,
    dim = 2304,
    n_layers = 26,
    n_heads = 8,
    n_kv_heads = 4,
    head_dim = 256,
    ffn_dim = 9216,
    max_seq_len = 8192,
  },
  data = { path = "data/gemma2-2b", seq_len = 8192 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 1, pp = 1, zero = 1 },
}
