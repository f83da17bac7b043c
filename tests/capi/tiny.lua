-- The recipe of the C API and binding tests (tests/capi/run_test.sh, bindings/*/tests):
-- a tiny LLaMA on the dataset "ds" the test prepares in its workdir, trained until stopped.
return tide.recipe {
  name = "capi", seed = 7, threads = 1,
  model = tide.models.llama { vocab_size = 300, dim = 64, n_layers = 2, n_heads = 4, n_kv_heads = 2,
                              multiple_of = 32, max_seq_len = 64 },
  data = { path = "ds", seq_len = 64 },
  batch = { micro_batch = 2, global_batch = 8 },
  optimizer = { lr = 1e-3 },
  schedule = { steps = 100000, warmup_steps = 2, decay = "constant" },
  checkpoint = { every = 0, keep_last = 3 },
  eval = { every = 0 },
  log_every = 1000,
}
