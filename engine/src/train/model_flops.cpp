// The model-FLOPs count of flops.h: arithmetic on the config, no LibTorch (the planner
// uses it too).
#include "tide/engine/train/flops.h"

#include <cmath>

namespace tide {

double train_flops_per_token(const ModelConfig& m, int64_t seq_len) {
  int64_t matmul_params = parameter_count(m) - m.vocab_size * m.dim;  // minus the lookup table
  if (m.tie_embeddings) matmul_params += m.vocab_size * m.dim;        // it is also the output projection
  if (m.positions == PositionKind::Learned) matmul_params -= m.max_seq_len * m.dim;
  matmul_params -= inactive_expert_parameter_count(m);  // a token multiplies by its top k experts alone
  // Scores and the weighted sum: 12 FLOPs per layer, key and query width (n_heads *
  // head_dim, dim unless the model sets its own head width).
  const auto width = static_cast<double>(m.n_heads * head_dim(m));
  double keys = 0;
  for (int64_t layer = 0; layer < m.n_layers; ++layer) keys += counted_keys(m, layer, seq_len);
  // LoRA: a frozen weight is multiplied forward and by its output's gradient, 4 FLOPs a
  // weight; its own gradient, the other 2, is not computed. The adapters train whole.
  const auto frozen = static_cast<double>(m.lora_rank > 0 ? matmul_params - lora_parameter_count(m) : 0);
  return 6.0 * static_cast<double>(matmul_params) - 2.0 * frozen + 12.0 * width * keys;
}

double counted_keys(const ModelConfig& m, int64_t layer, int64_t seq_len) {
  const auto t = static_cast<double>(seq_len), w = static_cast<double>(m.sliding_window);
  if (!window_leaves_out_keys(m, layer, seq_len)) return t;
  return t * (w * (w + 1) / 2 + (t - w) * w) / (t * (t + 1) / 2);
}

double computed_keys(const ModelConfig& m, int64_t layer, int64_t seq_len, bool documents, bool fused) {
  const auto t = static_cast<double>(seq_len);
  const bool softcap = m.attention_softcap > 0;
  const bool masked = documents || m.positions == PositionKind::ALiBi;
  // A query of a causal square of n: soft-capped, the keys up to its block's last query;
  // a fused kernel with no mask skips the blocks above the diagonal; else every key.
  const auto causal = [&](double n) { return softcap || (fused && !masked) ? n / 2 : n; };
  if (!window_leaves_out_keys(m, layer, seq_len)) return causal(t);
  // In parts (attention_masks.h): the first w queries a causal square; each later block
  // of R queries R + w keys, the soft-capped op only those up to each of its own blocks'
  // last query (about w + R / 2); the queries left after the last whole block likewise.
  const auto w = static_cast<double>(m.sliding_window);
  const auto rows = static_cast<double>(window_block_rows(m.sliding_window));
  const double blocks = std::floor((t - w) / rows), left = t - w - blocks * rows;
  const auto block = [&](double r) { return r * (softcap ? w + r / 2 : r + w); };
  return (w * causal(w) + blocks * block(rows) + block(left)) / t;
}

}  // namespace tide
