-- Gemma 3 4B's language model: Gemma's architecture with norms after attention and the MLP
-- too, query/key norms, heads of 256, and five layers attending over a sliding window of
-- 1024 tokens (RoPE base 10^4) for every one attending in full (base 10^6, stretched 8
-- times: linear RoPE scaling), layers 5, 11, 17, ... (Gemma 3 technical report, 2025;
-- Hugging Face config.json of google/gemma-3-4b-pt, a Gemma3ForConditionalGeneration whose
-- text_config this is). Its count is the published total less the SigLIP vision tower
-- (416,866,032) and the projector, which tide does not train; `tide train` with
-- checkpoint.init_from = that directory loads the language model alone. Training it needs
-- GPUs and a layout for them (`tide plan` on 8 H100s fits this layout).
return tide.recipe {
  name = "gemma3-4b",
  model = tide.models.gemma3 {
    vocab_size = 262208,
    dim = 2560,
    n_layers = 34,
    n_heads = 8,
    n_kv_heads = 4,
    head_dim = 256,
    ffn_dim = 10240,
    max_seq_len = 131072,
    sliding_window = 1024,
    rope_scaling = "linear",
    rope_scaling_factor = 8,
  },
  data = { path = "data/gemma3-4b", seq_len = 8192 },
  batch = { micro_batch = 1, global_batch = 512 },
  optimizer = { lr = 3e-4, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1, grad_clip = 1.0 },
  schedule = { steps = 250000, warmup_steps = 2000, decay = "cosine", min_lr = 3e-5 },
  precision = { compute = "bf16" },
  checkpoint = { every = 1000, keep_last = 3 },
  parallel = { tp = 1, pp = 1, zero = 1 },
}
