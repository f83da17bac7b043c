-- Gemma 2 27B: Gemma's architecture with norms after attention and the MLP too, attention
-- scores soft-capped at 50 and logits at 30, and layers that alternate between a sliding
-- window of 4096 tokens (the even ones) and full attention (the odd ones), heads of 128
-- (Gemma 2 technical report, 2024; Hugging Face config.json of google/gemma-2-27b).
-- Validates and reports its parameter count here; training it needs GPUs and a layout for
-- them (`tide plan` on 8 H100s fits this layout). Soft-capped attention runs a block of
-- queries at a time in LibTorch ops (no fused kernel takes a cap). Its tokenizer.model
-- (SentencePiece, 256,000 pieces) prepares data: `tide data prepare --tokenizer`.
return tide.recipe {
  name = "gemma2-27b",
  model = tide.models.gemma2 {
    vocab_size = 256000,
    dim = 4608,
    n_layers = 46,
    n_heads = 32,
    n_kv_heads = 16,
    head_dim = 128,
    ffn_dim = 36864,
    max_seq_len = 8192,
    -- query_pre_attn_scalar 144 = dim / n_heads, not the heads' width of 128
    softmax_scale = 1 / math.sqrt(144),
  },
  data = { path = "data/gemma2-27b", seq_len = 8192 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 4, pp = 1, zero = 3, offload_optimizer = true },
}
