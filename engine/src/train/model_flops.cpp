// The model-FLOPs count of flops.h: arithmetic on the config, no LibTorch (the planner
// uses it too).
#include "tide/engine/train/flops.h"

namespace tide {

double train_flops_per_token(const ModelConfig& m, int64_t seq_len) {
  int64_t matmul_params = parameter_count(m) - m.vocab_size * m.dim;  // minus the lookup table
  if (m.tie_embeddings) matmul_params += m.vocab_size * m.dim;        // it is also the output projection
  if (m.positions == PositionKind::Learned) matmul_params -= m.max_seq_len * m.dim;
  // Scores and the weighted sum: 12 FLOPs per layer, key and query width (n_heads *
  // head_dim, dim unless the model sets its own head width).
  const auto width = static_cast<double>(m.n_heads * head_dim(m));
  double keys = 0;
  for (int64_t layer = 0; layer < m.n_layers; ++layer) keys += counted_keys(m, layer, seq_len);
  return 6.0 * static_cast<double>(matmul_params) + 12.0 * width * keys;
}

double counted_keys(const ModelConfig& m, int64_t layer, int64_t seq_len) {
  const auto t = static_cast<double>(seq_len), w = static_cast<double>(m.sliding_window);
  if (!window_leaves_out_keys(m, layer, seq_len)) return t;
  return t * (w * (w + 1) / 2 + (t - w) * w) / (t * (t + 1) / 2);
}

double computed_keys(const ModelConfig& m, int64_t layer, int64_t seq_len, bool documents, bool fused) {
  const auto t = static_cast<double>(seq_len);
  if (m.attention_softcap > 0) return t / 2;
  const bool masked = documents || m.positions == PositionKind::ALiBi || window_leaves_out_keys(m, layer, seq_len);
  return fused && !masked ? t / 2 : t;
}

}  // namespace tide
