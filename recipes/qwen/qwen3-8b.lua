-- Qwen3 8B: LLaMA's architecture with an RMSNorm over each head's query and key before
-- RoPE (model.qk_norm), 32 query and 8 key/value heads of 128 and RoPE base 10^6 (Qwen3
-- technical report; Hugging Face config.json of Qwen/Qwen3-8B-Base). Validates and
-- reports its parameter count here; training it needs a GPU cluster and a layout for it
-- (docs/parallelism.md). Its tokenizer.json (NFC, byte-level BPE) prepares data:
-- `tide data prepare --tokenizer`.
return tide.recipe {
  name = "qwen3-8b",
  model = tide.models.llama {
    vocab_size = 151936,
    dim = 4096,
    n_layers = 36,
    n_heads = 32,
    n_kv_heads = 8,
    head_dim = 128,
    ffn_dim = 12288,
    qk_norm = true,
    norm_eps = 1e-6,
    rope_theta = 1000000,
    max_seq_len = 32768,
  },
  data = { path = "data/qwen3-8b", seq_len = 4096 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 1, pp = 1, zero = 1 },
}
