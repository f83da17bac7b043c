#include "rank_model.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace tide::plan {

namespace {
int64_t padded(int64_t n, int64_t to) { return (n + to - 1) / to * to; }
}  // namespace

std::vector<int64_t> RankModel::units(int64_t pad_to) const {
  std::vector<int64_t> out{padded(outside_elements, pad_to)};
  const int64_t block = block_elements - (experts_apart ? block_expert_elements() : 0);
  for (int64_t b = 0; b < blocks; ++b) out.push_back(padded(block, pad_to));
  if (head_elements > 0) out.push_back(padded(head_elements, pad_to));
  return out;
}

std::vector<int64_t> RankModel::expert_units(int64_t pad_to) const {
  if (!experts_apart) return {};
  std::vector<int64_t> out{0};
  for (int64_t b = 0; b < blocks; ++b) out.push_back(padded(block_expert_elements(), pad_to));
  return out;
}

int64_t RankModel::expert_padded_elements(int64_t pad_to) const {
  const auto all = expert_units(pad_to);
  return std::accumulate(all.begin(), all.end(), int64_t{0});
}

int64_t RankModel::expert_block_unit(int64_t pad_to) const {
  return experts_apart && blocks > 0 ? padded(block_expert_elements(), pad_to) : 0;
}

int64_t RankModel::padded_elements(int64_t pad_to) const {
  const auto all = units(pad_to);
  return std::accumulate(all.begin(), all.end(), int64_t{0});
}

int64_t RankModel::largest_block_unit(int64_t pad_to) const { return blocks > 0 ? units(pad_to)[1] : 0; }

RankModel rank_model(const ModelConfig& m, int64_t tp, const PipelineStage& stage, int64_t ep) {
  RankModel r;
  const int64_t d = m.dim, hd = head_dim(m), kv = resolved_kv_heads(m);
  r.dim = d;
  r.head_dim = hd;
  r.heads = m.n_heads / tp;
  r.ffn = resolved_ffn_dim(m) / tp;
  r.vocab = (m.vocab_size + tp - 1) / tp;  // padded_vocab(V, tp) / tp
  r.first = stage.first;
  r.last = stage.last;
  r.blocks = stage_blocks(stage, m.n_layers);
  for (const auto& c : stage.chunks)
    for (int64_t i = c.first; i < c.first + range_blocks(c, m.n_layers); ++i) r.layers.push_back(i);

  // A block (layers.cpp): two norms (four with post_norms), attention, MLP.
  const int64_t norm = m.norm == NormKind::LayerNorm ? 2 * d : d;
  const int64_t local = r.heads * hd;
  int64_t attention = 0, attention_matmul = 0, kv_whole = 0;
  if (m.family == Family::BLOOM) {
    attention_matmul = d * 3 * local + local * d;
    attention = attention_matmul + (m.attention_bias ? 3 * local + d : 0);
    r.kv_heads = r.heads;
  } else {
    const bool kv_split = kv % tp == 0;
    r.kv_heads = kv_split ? kv / tp : 1;
    const int64_t kv_rows = (kv_split ? kv / tp : kv) * hd;  // held whole when fewer than tp
    attention_matmul = d * local + 2 * d * kv_rows + local * d;
    if (!kv_split) kv_whole = 2 * d * kv_rows;
    attention = attention_matmul + (m.attention_bias || m.qkv_bias ? local + 2 * kv_rows : 0) +
                (m.attention_bias ? d : 0) + (m.qk_norm ? 2 * hd : 0);
  }
  const int64_t mlp_matrices = gated_mlp(m) ? 3 : 2;
  const int64_t mlp_matmul = mlp_matrices * d * r.ffn;
  const int64_t mlp = mlp_matmul + (m.mlp_bias ? (mlp_matrices - 1) * r.ffn + d : 0);
  if (m.moe_experts > 0) {  // the block's MLP is E of them beside a router
    r.experts = m.moe_experts / ep;
    r.top_k = m.moe_top_k;
    r.kept_choices =
        static_cast<double>(r.top_k) * (m.moe_capacity_factor > 0 ? std::min(1.0, m.moe_capacity_factor) : 1.0);
    r.expert_elements = mlp;
    r.expert_matmul = mlp_matmul;
    r.router = d * m.moe_experts;
    r.experts_apart = ep > 1;
    // The shared expert (every token through it) and its gate, [1, D], a projection.
    r.shared_ffn = m.moe_shared_ffn_dim / tp;
    const int64_t shared_matmul = mlp_matrices * d * r.shared_ffn + (m.moe_shared_gate ? d : 0);
    const int64_t shared = shared_matmul + (m.mlp_bias && r.shared_ffn > 0 ? (mlp_matrices - 1) * r.shared_ffn + d : 0);
    r.block_matmul = attention_matmul + r.experts * mlp_matmul + shared_matmul;
    r.block_token_weights =
        attention_matmul + r.router + std::llround(r.kept_choices * static_cast<double>(mlp_matmul)) + shared_matmul;
    r.block_elements = block_norms(m) * norm + attention + r.router + r.experts * mlp + shared;
  } else {
    r.block_matmul = attention_matmul + mlp_matmul;
    r.block_token_weights = r.block_matmul;
    r.block_elements = block_norms(m) * norm + attention + mlp;
  }
  r.block_widened = r.block_elements - r.block_matmul + kv_whole;

  // Unit 0 (transformer.cpp, parameter_names.h): the embedding on the first stage (and
  // its copy on the last when tied), learned positions and the embedding norm on the
  // first. The last stage's final norm joins it when tied, else it and the head are a
  // unit of their own.
  int64_t outside = 0;
  if (stage.first || (stage.last && m.tie_embeddings)) outside += r.vocab * d;
  if (stage.first && m.positions == PositionKind::Learned) outside += m.max_seq_len * d;
  if (stage.first && m.embedding_norm) outside += 2 * d;
  if (stage.last) (m.tie_embeddings ? outside : r.head_elements) += norm + (m.tie_embeddings ? 0 : r.vocab * d);
  r.outside_elements = outside;
  r.head_matmul = stage.last ? r.vocab * d : 0;
  return r;
}

}  // namespace tide::plan
