// Small model shapes of both families for engine tests.
#pragma once

#include <ostream>

#include "tide/engine/config.h"

namespace tide::testing {

inline ModelConfig tiny_llama() {
  ModelConfig m;
  m.family = Family::LLaMA;
  m.vocab_size = 97;  // odd on purpose
  m.dim = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;  // grouped-query
  m.multiple_of = 16;
  m.max_seq_len = 32;
  return m;
}

inline ModelConfig tiny_bloom() {
  ModelConfig m;
  m.family = Family::BLOOM;
  m.vocab_size = 97;
  m.dim = 24;
  m.n_layers = 2;
  m.n_heads = 6;  // not a power of two: exercises ALiBi's extra slopes
  m.max_seq_len = 32;
  m.norm = NormKind::LayerNorm;
  m.positions = PositionKind::ALiBi;
  m.mlp = MlpKind::GELU;
  m.attention_bias = m.mlp_bias = m.embedding_norm = m.tie_embeddings = true;
  return m;
}

// Gemma's architecture at tiny_llama's size: a GeGLU MLP, norms multiplying by 1 + weight,
// embeddings scaled by sqrt(dim) and tied, heads of 16 (attention 64 wide at dim 32).
inline ModelConfig tiny_gemma() {
  ModelConfig m = tiny_llama();
  m.mlp = MlpKind::GeGLU;
  m.norm_zero_centered = true;
  m.embedding_scale = 5.656854249492381;  // sqrt(32)
  m.tie_embeddings = true;
  m.head_dim = 16;
  return m;
}

// Gemma 3's architecture at that size: post-norms, query/key norms, scores scaled by
// 24^-1/2 (query_pre_attn_scalar 24, not the head's 16).
inline ModelConfig tiny_gemma3() {
  ModelConfig m = tiny_gemma();
  m.post_norms = true;
  m.qk_norm = true;
  m.softmax_scale = 0.20412414523193154;  // 1 / sqrt(24)
  return m;
}

// A mixture of experts at tiny_llama's size (Mixtral's form): four SwiGLU experts of
// width 24 a block, two chosen a token.
inline ModelConfig tiny_moe() {
  ModelConfig m = tiny_llama();
  m.moe_experts = 4;
  m.moe_top_k = 2;
  m.ffn_dim = 24;
  return m;
}

}  // namespace tide::testing

namespace tide {
// Short names in test output instead of gtest's byte dump of the struct.
inline void PrintTo(const ModelConfig& m, std::ostream* os) {
  *os << (m.family == Family::BLOOM ? "bloom"
          : m.post_norms            ? "gemma3"
          : m.mlp == MlpKind::GeGLU ? "gemma"
                                    : "llama")
      << "(dim=" << m.dim << ", layers=" << m.n_layers << ")";
}
}  // namespace tide
