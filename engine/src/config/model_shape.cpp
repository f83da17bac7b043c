#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "tide/engine/config.h"

namespace tide {

int64_t resolved_kv_heads(const ModelConfig& m) { return m.n_kv_heads > 0 ? m.n_kv_heads : m.n_heads; }

int64_t head_dim(const ModelConfig& m) { return m.head_dim > 0 ? m.head_dim : m.dim / m.n_heads; }

bool gated_mlp(const ModelConfig& m) { return m.mlp != MlpKind::GELU; }

int64_t block_norms(const ModelConfig& m) { return m.post_norms ? 4 : 2; }

bool attends_over_window(const ModelConfig& m, int64_t layer) {
  const auto& full = m.full_attention_layers;
  return m.sliding_window > 0 && std::find(full.begin(), full.end(), layer) == full.end();
}

bool window_leaves_out_keys(const ModelConfig& m, int64_t layer, int64_t seq_len) {
  return attends_over_window(m, layer) && m.sliding_window < seq_len;
}

bool unmasked_context_layer(const ModelConfig& m, int64_t layer, int64_t seq_len, bool documents_apart) {
  return !window_leaves_out_keys(m, layer, seq_len) && m.positions != PositionKind::ALiBi && !documents_apart &&
         m.dropout == 0 && m.attention_softcap == 0;
}

bool context_heads_split(int64_t heads, int64_t kv_heads, int64_t cp) {
  return heads % cp == 0 && (kv_heads % cp == 0 || cp % kv_heads == 0);
}

int64_t context_kv_heads_exchanged(int64_t kv_heads, int64_t cp) { return kv_heads % cp == 0 ? kv_heads : cp; }

int64_t window_block_rows(int64_t window) {
  // Half the window: each query computes 1.5 w scores (w of them needed). A quarter was
  // 9% faster again on the CPU (4096 tokens, w 512), but keeps every key and value five
  // times over for backward where half keeps them three times.
  return std::max<int64_t>(1, window / 2);
}

ModelConfig windowed_rope(const ModelConfig& m) {
  ModelConfig local = m;
  if (m.rope_local_theta > 0) {
    local.rope_theta = m.rope_local_theta;
    local.rope_scaling = RopeScaling::None;
  }
  return local;
}

int64_t resolved_ffn_dim(const ModelConfig& m) {
  if (m.ffn_dim > 0) return m.ffn_dim;
  if (m.mlp == MlpKind::GELU) return 4 * m.dim;
  // LLaMA: two thirds of 4*dim (a gated MLP has three matrices), optionally scaled, then
  // rounded up to a multiple of `multiple_of` (7B: 11008; 70B: 28672).
  int64_t hidden = 4 * m.dim;
  hidden = (2 * hidden) / 3;
  if (m.ffn_dim_multiplier > 0) hidden = static_cast<int64_t>(m.ffn_dim_multiplier * static_cast<double>(hidden));
  const int64_t k = m.multiple_of > 0 ? m.multiple_of : 1;
  return k * ((hidden + k - 1) / k);
}

std::vector<std::string> block_projection_names(const ModelConfig& m) {
  const bool bloom = m.family == Family::BLOOM;
  std::vector<std::string> out;
  if (bloom)
    out = {"query_key_value", "dense"};
  else
    out = {"q_proj", "k_proj", "v_proj", "o_proj"};
  if (bloom && m.mlp == MlpKind::GELU) {  // layers.cpp: BLOOM's names for BLOOM's MLP
    out.insert(out.end(), {"dense_h_to_4h", "dense_4h_to_h"});
    return out;
  }
  if (gated_mlp(m)) out.emplace_back("gate_proj");
  out.insert(out.end(), {"up_proj", "down_proj"});
  return out;
}

ProjectionSplit projection_split(const ModelConfig& m, const std::string& module, int64_t tp) {
  const auto names = block_projection_names(m);
  if (std::find(names.begin(), names.end(), module) == names.end()) return ProjectionSplit::Whole;
  if (module == "o_proj" || module == "down_proj" || module == "dense" || module == "dense_4h_to_h")
    return ProjectionSplit::Row;
  const bool kv_split = resolved_kv_heads(m) % tp == 0;
  if (!kv_split && (module == "k_proj" || module == "v_proj")) return ProjectionSplit::Whole;
  return ProjectionSplit::Column;
}

std::vector<std::string> lora_target_names(const ModelConfig& m) {
  if (m.lora_rank == 0) return {};
  return m.lora_targets.empty() ? block_projection_names(m) : m.lora_targets;
}

namespace {
// A block projection's input and output widths, by its name (block_projection_names).
std::pair<int64_t, int64_t> projection_widths(const ModelConfig& m, const std::string& name) {
  const int64_t d = m.dim, f = resolved_ffn_dim(m);
  const int64_t q = m.n_heads * head_dim(m), kv = resolved_kv_heads(m) * head_dim(m);
  if (name == "q_proj") return {d, q};
  if (name == "k_proj" || name == "v_proj") return {d, kv};
  if (name == "o_proj") return {q, d};
  if (name == "query_key_value") return {d, 3 * d};
  if (name == "dense") return {d, d};
  if (name == "down_proj" || name == "dense_4h_to_h") return {f, d};
  return {d, f};  // gate_proj, up_proj, dense_h_to_4h
}
}  // namespace

int64_t lora_parameter_count(const ModelConfig& m) { return lora_rank_parameter_count(m, 1, m.n_layers); }

int64_t lora_rank_parameter_count(const ModelConfig& m, int64_t tp, int64_t blocks) {
  // The split side of each adapter (projection_split): a column-parallel layer's B (its
  // output rows), a row-parallel layer's A (its input columns).
  int64_t block = 0;
  for (const auto& name : lora_target_names(m)) {
    const auto [in, out] = projection_widths(m, name);
    const ProjectionSplit split = projection_split(m, name, tp);
    block += m.lora_rank * (split == ProjectionSplit::Row      ? in / tp + out
                            : split == ProjectionSplit::Column ? in + out / tp
                                                               : in + out);
  }
  return blocks * block;
}

namespace {
// One MLP of the model's kind and width f: a dense block's, or one expert's (and a shared
// expert's, of its own width).
int64_t mlp_parameter_count(const ModelConfig& m, int64_t f) {
  const int64_t d = m.dim;
  int64_t mlp = gated_mlp(m) ? 3 * d * f : 2 * d * f;
  if (m.mlp_bias) mlp += (gated_mlp(m) ? 2 * f : f) + d;
  return mlp;
}
}  // namespace

int64_t inactive_expert_parameter_count(const ModelConfig& m) {
  if (m.moe_experts == 0) return 0;
  return m.n_layers * (m.moe_experts - m.moe_top_k) * mlp_parameter_count(m, resolved_ffn_dim(m));
}

int64_t parameter_count(const ModelConfig& m) {
  const int64_t d = m.dim, v = m.vocab_size;
  const int64_t q = m.n_heads * head_dim(m), kv = resolved_kv_heads(m) * head_dim(m);
  const int64_t norm = m.norm == NormKind::LayerNorm ? 2 * d : d;

  int64_t attention = d * q + 2 * d * kv + q * d;
  if (m.attention_bias || m.qkv_bias) attention += q + 2 * kv;
  if (m.attention_bias) attention += d;
  if (m.qk_norm) attention += 2 * head_dim(m);
  int64_t mlp = mlp_parameter_count(m, resolved_ffn_dim(m));
  if (m.moe_experts > 0) mlp = m.moe_experts * (mlp + d);  // the experts and the router's rows
  if (m.moe_shared_ffn_dim > 0) mlp += mlp_parameter_count(m, m.moe_shared_ffn_dim) + (m.moe_shared_gate ? d : 0);
  const int64_t block = block_norms(m) * norm + attention + mlp;

  int64_t total = v * d + m.n_layers * block + norm;
  if (m.positions == PositionKind::Learned) total += m.max_seq_len * d;
  if (m.embedding_norm) total += 2 * d;
  if (!m.tie_embeddings) total += v * d;
  return total + lora_parameter_count(m);
}

}  // namespace tide
