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
  return 6.0 * static_cast<double>(matmul_params) +
         12.0 * static_cast<double>(m.n_layers) * width * static_cast<double>(seq_len);
}

}  // namespace tide
