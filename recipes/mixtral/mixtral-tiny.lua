-- llama-tiny's shape with a mixture of experts in every block (Mixtral's form): 8
-- SwiGLU experts of width 256, 2 chosen a token, so a token's compute is about
-- llama-tiny's while the MLPs hold four times its weights. Trains on the bundled corpus
-- (`make demo` prepares data/kjv) in minutes on two CPU cores; the progress line shows
-- the router's load balance (1.0: even).
return tide.recipe {
  name = "mixtral-tiny",
  seed = 1234,
  model = tide.models.llama {
    vocab_size = 8192,
    dim = 256,
    n_layers = 4,
    n_heads = 4,
    n_kv_heads = 2,
    ffn_dim = 256,
    moe_experts = 8,
    moe_top_k = 2,
    max_seq_len = 256,
  },
  data = { path = "data/kjv", seq_len = 256 },
  batch = { micro_batch = 8, global_batch = 8 },
  optimizer = { lr = 2e-3, weight_decay = 0.1, grad_clip = 1.0, beta2 = 0.99 },
  schedule = { steps = 250, warmup_steps = 20, decay = "cosine", min_lr = 1e-4 },
  eval = { every = 50, batches = 8 },
  log_every = 5,
}
