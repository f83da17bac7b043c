-- Qwen2.5 7B: LLaMA's architecture with biases on the query, key and value projections,
-- grouped-query attention (28 heads, 4 key/value heads) and RoPE base 10^6 (Qwen2.5
-- technical report; Hugging Face config.json of Qwen/Qwen2.5-7B). Its 32K context
-- stretches to 128K with YaRN, as its model card advises for long inputs only:
-- rope_scaling = "yarn", rope_scaling_factor = 4, rope_original_max_seq_len = 32768,
-- max_seq_len = 131072. Validates and reports its parameter count here; training it
-- needs a GPU cluster and a layout for it (docs/parallelism.md). Its tokenizer.json
-- (NFC, byte-level BPE) prepares data: `tide data prepare --tokenizer`.
return tide.recipe {
  name = "qwen2.5-7b",
  model = tide.models.llama {
    vocab_size = 152064,
    dim = 3584,
    n_layers = 28,
    n_heads = 28,
    n_kv_heads = 4,
    ffn_dim = 18944,
    qkv_bias = true,
    norm_eps = 1e-6,
    rope_theta = 1000000,
    max_seq_len = 32768,
  },
  data = { path = "data/qwen2.5-7b", seq_len = 4096 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 1, pp = 1, zero = 1 },
}
