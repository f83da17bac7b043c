-- LLaMA-3.1 8B: LLaMA-3 8B's shape with its context stretched to 128K tokens by Llama 3.1's
-- RoPE scaling (Meta model card; Hugging Face config.json rope_scaling "llama3": factor 8,
-- low and high frequency factors 1 and 4, pretrained context 8192). Validates and reports
-- its parameter count here; training it needs a GPU cluster and a layout for it
-- (parallel.dp, tp, pp, zero; docs/parallelism.md). Continued pretraining from LLaMA-3 8B
-- weights: checkpoint.init_from = "<imported llama-3-8b>".
return tide.recipe {
  name = "llama-3.1-8b",
  model = tide.models.llama {
    vocab_size = 128256,
    dim = 4096,
    n_layers = 32,
    n_heads = 32,
    n_kv_heads = 8,
    ffn_dim_multiplier = 1.3,
    multiple_of = 1024,
    rope_theta = 500000,
    rope_scaling = "llama3",
    rope_scaling_factor = 8,
    rope_low_freq_factor = 1,
    rope_high_freq_factor = 4,
    rope_original_max_seq_len = 8192,
    max_seq_len = 131072,
  },
  data = { path = "data/llama-3.1-8b", seq_len = 8192 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-5, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 500000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 1, pp = 1, zero = 1 },
}
