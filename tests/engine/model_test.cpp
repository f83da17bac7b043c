#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include "tide/engine/model/transformer.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/train/tensor_memory.h"
#include "tiny_models.h"

namespace tide {
namespace {
using testing::tiny_bloom;
using testing::tiny_llama;

int64_t numel(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

class BothFamilies : public ::testing::TestWithParam<ModelConfig> {};

TEST_P(BothFamilies, ParameterCountFormulaMatchesAllocation) {
  Transformer m(GetParam());
  EXPECT_EQ(numel(*m), parameter_count(GetParam()));
}

TEST_P(BothFamilies, LaterTokensNeverChangeEarlierLogits) {
  torch::manual_seed(0);
  Transformer m(GetParam());
  m->eval();
  auto tokens = torch::randint(0, GetParam().vocab_size, {2, 16}, torch::kInt64);
  const auto before = m->forward(tokens);
  auto changed = tokens.clone();
  changed.narrow(1, 10, 6).random_(0, GetParam().vocab_size);
  const auto after = m->forward(changed);
  EXPECT_TRUE(torch::equal(before.narrow(1, 0, 10), after.narrow(1, 0, 10)));
  EXPECT_FALSE(torch::allclose(before.narrow(1, 10, 6), after.narrow(1, 10, 6)));
}

TEST_P(BothFamilies, InitialLossIsNearLogVocab) {
  torch::manual_seed(0);
  Transformer m(GetParam());
  m->reset_parameters(42);
  const auto tokens = torch::randint(0, GetParam().vocab_size, {4, 32}, torch::kInt64);
  const auto targets = torch::randint(0, GetParam().vocab_size, {4, 32}, torch::kInt64);
  const double loss = m->loss(tokens, targets).item<double>();
  EXPECT_NEAR(loss, std::log(static_cast<double>(GetParam().vocab_size)), 0.1);
}

TEST_P(BothFamilies, InitialisationIsSeededAndPerName) {
  Transformer a(GetParam()), b(GetParam());
  a->reset_parameters(7);
  b->reset_parameters(7);
  for (const auto& item : a->named_parameters())
    EXPECT_TRUE(torch::equal(item.value(), b->named_parameters()[item.key()])) << item.key();
  b->reset_parameters(8);
  EXPECT_FALSE(torch::equal(a->tok_embeddings, b->tok_embeddings));
  // Normal(0, 0.02): over N values the mean's standard error is 0.02 / sqrt(N) and the
  // standard deviation's 0.02 / sqrt(2 N); five of either would be a broken draw.
  const double n = static_cast<double>(a->tok_embeddings.numel());
  const double std = a->tok_embeddings.std().item<double>();
  EXPECT_NEAR(std, 0.02, 5 * 0.02 / std::sqrt(2 * n));
  EXPECT_NEAR(a->tok_embeddings.mean().item<double>(), 0.0, 5 * 0.02 / std::sqrt(n));
}

// A run's model is built as shapes and each parameter written where it is placed
// (parallelize.h): it must hold what reset_parameters gives, drawn in place or not.
TEST_P(BothFamilies, ADeferredModelPlacedInFlatBuffersHoldsTheResetValues) {
  Transformer reference(GetParam());
  reference->reset_parameters(11);
  Transformer deferred(GetParam(), TensorParallel{}, PipelineStage{}, ParameterStorage::Deferred);
  for (const auto& item : deferred->named_parameters())
    EXPECT_EQ(item.value().storage().data_ptr().get(), nullptr)
        << item.key() << ": a deferred model holds parameter memory before it is placed";
  FlatParameters::Options options;
  options.initial_values = [&](const std::string& name, const torch::Tensor& into, int64_t first) {
    deferred->initialise_parameter(name, into, 11, first);
  };
  FlatParameters flat(*deferred, OptimConfig{}, options);
  const auto expected = reference->named_parameters();
  for (const auto& item : deferred->named_parameters()) {
    EXPECT_TRUE(item.value().storage().is_alias_of(flat.data().storage())) << item.key();
    EXPECT_TRUE(torch::equal(item.value(), expected[item.key()])) << item.key();
    // Into a strided tensor the draw goes through a contiguous one: the same values.
    auto strided = torch::empty_like(item.value()).t().contiguous().t();
    if (item.value().dim() == 2) {
      EXPECT_FALSE(strided.is_contiguous());
    }
    deferred->initialise_parameter(item.key(), strided, 11);
    EXPECT_TRUE(torch::equal(strided, expected[item.key()])) << item.key();
  }
}

// A ZeRO-3 rank draws only its pieces of a parameter: any range drawn alone holds what
// the whole draw holds there, whatever the thread count.
TEST_P(BothFamilies, AnyRangeOfAParameterDrawnAloneHoldsTheWholeDrawsValues) {
  ModelConfig cfg = GetParam();
  cfg.vocab_size = 2000;  // an embedding of several threads' grains
  const int threads = at::get_num_threads();
  at::set_num_threads(2);
  Transformer m(cfg), one_thread(cfg);
  m->reset_parameters(5);
  at::set_num_threads(1);
  one_thread->reset_parameters(5);
  EXPECT_TRUE(torch::equal(m->tok_embeddings, one_thread->tok_embeddings));
  for (const auto& item : m->named_parameters()) {
    const auto whole = item.value().reshape({-1});
    const int64_t n = whole.numel();
    for (const int64_t first : {int64_t{0}, int64_t{1}, int64_t{3}, n / 3, n - 5}) {
      const int64_t count = std::min<int64_t>(n - first, 4 * (first % 7) + 9);
      auto part = torch::full({count}, -7.0f);
      at::set_num_threads(first % 2 == 0 ? 1 : 2);
      m->initialise_parameter(item.key(), part, 5, first);
      EXPECT_TRUE(torch::equal(part, whole.narrow(0, first, count))) << item.key() << " from " << first;
    }
  }
  at::set_num_threads(threads);
}

TEST_P(BothFamilies, ABlockAddsEachLayerOntoItsInputAsTheUnfusedSumDoes) {
  // Each layer adds its output onto the residual stream its normed_projections node hands
  // on, whose gradient joins the norm's in the norm's backward. In fp64 against the
  // block's two residual adds written out: the same output and gradients to fp64's
  // rounding.
  ModelConfig c = GetParam();
  c.n_layers = 1;
  Transformer m(c);
  m->to(torch::kFloat64);
  auto block = std::dynamic_pointer_cast<BlockImpl>((*m->blocks)[0]);
  const int64_t t = 9, hd = head_dim(c);
  torch::manual_seed(4);
  const auto x = torch::randn({2, t, c.dim}, torch::kFloat64), up = torch::randn({2, t, c.dim}, torch::kFloat64);
  const auto bias = m->attention_bias(t, x.options());
  torch::Tensor cos, sin;
  if (c.positions == PositionKind::RoPE) {
    const auto inv = torch::pow(c.rope_theta, torch::arange(0, hd, 2, torch::kFloat64) / static_cast<double>(hd));
    const auto freqs = torch::outer(torch::arange(t, torch::kFloat64), inv.reciprocal());
    cos = torch::cat({freqs, freqs}, -1).cos();
    sin = torch::cat({freqs, freqs}, -1).sin();
  }
  const auto run = [&](const std::function<torch::Tensor(const torch::Tensor&)>& f) {
    for (auto& p : block->parameters()) p.mutable_grad() = torch::Tensor();
    const auto in = x.clone().requires_grad_();
    const auto out = f(in);
    out.backward(up);
    std::vector<torch::Tensor> got{out.detach(), in.grad()};
    for (const auto& p : block->parameters()) got.push_back(p.grad().clone());
    return got;
  };
  const auto fused = run([&](const torch::Tensor& in) { return block->forward(in, bias, cos, sin); });
  const auto apart = run([&](const torch::Tensor& in) {
    const auto post = [](Norm& norm, const torch::Tensor& y) { return norm ? norm(y) : y; };
    const auto h =
        in + post(block->attention_out_norm, block->attention(LayerInput(in, *block->input_norm), bias, cos, sin));
    return h + post(block->mlp_out_norm, block->mlp(LayerInput(h, *block->mlp_norm)));
  });
  ASSERT_EQ(fused.size(), apart.size());
  for (size_t i = 0; i < fused.size(); ++i)
    EXPECT_TRUE(torch::allclose(fused[i], apart[i], 1e-10, 1e-12)) << (i == 0 ? "output" : "gradient ") << i;
}

// Heads of their own width (model.head_dim): 4 heads of 16 make attention 64 wide in a
// model of dim 32, with biases on q, k and v counted at that width, and query/key norms
// of a head's width (model.qk_norm).
ModelConfig tiny_llama_with_wide_heads() {
  ModelConfig m = tiny_llama();
  m.head_dim = 16;
  m.qkv_bias = true;
  m.qk_norm = true;
  return m;
}

INSTANTIATE_TEST_SUITE_P(Model, BothFamilies,
                         ::testing::Values(tiny_llama(), tiny_bloom(), tiny_llama_with_wide_heads(),
                                           testing::tiny_gemma(), testing::tiny_gemma3()),
                         [](const auto& info) {
                           if (info.param.post_norms) return "gemma3";
                           if (info.param.mlp == MlpKind::GeGLU) return "gemma";
                           if (info.param.head_dim > 0) return "llama_wide_heads";
                           return info.param.family == Family::LLaMA ? "llama" : "bloom";
                         });

// Documents packed into rows, attended within each document only (data.document_attention).
class PackedDocuments : public ::testing::TestWithParam<ModelConfig> {};

TEST_P(PackedDocuments, EachDocumentIsComputedAsIfItStoodAlone) {
  torch::manual_seed(0);
  Transformer m(GetParam());
  m->reset_parameters(5);
  m->eval();
  // Two rows of 24 tokens: documents of 7, 10 and 7 tokens, then of 12 and 12.
  const std::vector<std::vector<int64_t>> lengths = {{7, 10, 7}, {12, 12}};
  const int64_t t = 24;
  const auto tokens = torch::randint(0, GetParam().vocab_size, {2, t}, torch::kInt64);
  const auto targets = torch::randint(0, GetParam().vocab_size, {2, t}, torch::kInt64);
  auto documents = torch::empty({2, t}, torch::kInt32);
  for (size_t r = 0; r < lengths.size(); ++r)
    for (int64_t d = 0, at = 0; d < static_cast<int64_t>(lengths[r].size()); at += lengths[r][d++])
      documents[static_cast<int64_t>(r)].narrow(0, at, lengths[r][d]).fill_(d);

  // Each document alone in a row of its own: positions from 0, nothing before it. RoPE
  // and ALiBi see only position differences, learned positions restart: in real
  // arithmetic the packed and the lone forward are equal. In fp32 they round apart: each
  // product is a dot product of at most 96 terms (n u = 96 * 2^-24 = 5.7e-6 relative at
  // worst), a few of them in sequence through two blocks whose final norm makes the
  // outputs O(1); 1e-4 bounds that. A token that sees another document moves by far more
  // (the control below: over 1e-3).
  const auto packed = m->hidden(tokens, documents);
  const auto unmasked = m->hidden(tokens);
  double moved = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    const auto row = static_cast<int64_t>(r);
    for (int64_t d = 0, at = 0; d < static_cast<int64_t>(lengths[r].size()); at += lengths[r][d++]) {
      const int64_t n = lengths[r][d];
      const auto alone = m->hidden(tokens[row].narrow(0, at, n).unsqueeze(0))[0];
      const auto here = packed[row].narrow(0, at, n);
      EXPECT_LE((here - alone).abs().max().item<double>(), 1e-4) << "row " << r << ", document " << d;
      if (d > 0) moved = std::max(moved, (unmasked[row].narrow(0, at, n) - alone).abs().max().item<double>());
    }
  }
  EXPECT_GT(moved, 1e-3) << "without the mask, later documents should see the earlier ones";

  // Training: the packed loss is the token-weighted mean of the lone documents' losses,
  // and so are its gradients.
  m->train();
  m->zero_grad();
  const auto packed_loss = m->loss(tokens, targets, documents);
  packed_loss.backward();
  std::vector<torch::Tensor> packed_grads;
  for (const auto& p : m->parameters()) packed_grads.push_back(p.grad().clone());
  m->zero_grad();
  auto alone_loss = torch::zeros({}, torch::kFloat32);
  for (size_t r = 0; r < lengths.size(); ++r)
    for (int64_t d = 0, at = 0; d < static_cast<int64_t>(lengths[r].size()); at += lengths[r][d++]) {
      const auto row = static_cast<int64_t>(r);
      const int64_t n = lengths[r][d];
      const auto part = m->loss(tokens[row].narrow(0, at, n).unsqueeze(0), targets[row].narrow(0, at, n).unsqueeze(0));
      alone_loss = alone_loss + part * (static_cast<double>(n) / static_cast<double>(2 * t));
    }
  alone_loss.backward();
  EXPECT_NEAR(packed_loss.item<double>(), alone_loss.item<double>(), 1e-4 * alone_loss.item<double>());
  const auto params = m->named_parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& alone = params[i].value().grad();
    const double scale = alone.abs().max().item<double>();
    EXPECT_LE((packed_grads[i] - alone).abs().max().item<double>(), 1e-4 * scale) << params[i].key();
  }
}

ModelConfig tiny_llama_with_learned_positions() {
  auto m = tiny_llama();
  m.positions = PositionKind::Learned;
  return m;
}

INSTANTIATE_TEST_SUITE_P(Model, PackedDocuments,
                         ::testing::Values(tiny_llama(), tiny_bloom(), tiny_llama_with_learned_positions()),
                         [](const auto& info) {
                           if (info.param.positions == PositionKind::Learned) return std::string("learned_positions");
                           return std::string(info.param.family == Family::LLaMA ? "llama" : "bloom");
                         });

// Attention's mask is one tensor that every block of a chunk keeps for backward: what a
// forward leaves alive (the graph's saved tensors, counted by the allocator) grows by the
// same bytes a block with documents apart as without them, and the documents' mask
// itself is counted once. PyTorch's attention turns a boolean mask into an additive one
// at every call, and autograd kept each block's copy: [B, 1, T, T] of fp32, 128 KiB here.
// Also for a sliding window's masks (made once for the run) and BLOOM's ALiBi bias.
TEST(Model, EveryBlockKeepsTheOneMaskItsChunkMade) {
  count_host_tensor_memory();
  const int64_t b = 2, t = 128;
  const auto kept = [&](ModelConfig c, int64_t layers, bool with_documents) {
    c.n_layers = layers;
    c.max_seq_len = t;
    torch::manual_seed(0);
    Transformer m(c);
    const auto tokens = torch::randint(0, c.vocab_size, {b, t}, torch::kInt64);
    const auto targets = torch::randint(0, c.vocab_size, {b, t}, torch::kInt64);
    torch::Tensor documents;
    if (with_documents) documents = torch::arange(t, torch::kInt32).div(50, "floor").expand({b, t}).contiguous();
    const int64_t before = host_tensor_bytes();
    const auto loss = m->loss(tokens, targets, documents);
    return host_tensor_bytes() - before;
  };
  const int64_t mask = b * t * t * 4;
  ModelConfig windowed = tiny_llama();
  windowed.sliding_window = 16;
  for (const ModelConfig& c : {tiny_llama(), windowed, tiny_bloom()}) {
    SCOPED_TRACE(c.family == Family::BLOOM ? "bloom" : c.sliding_window > 0 ? "windowed llama" : "llama");
    const int64_t block = kept(c, 4, false) - kept(c, 2, false);
    EXPECT_EQ(kept(c, 4, true) - kept(c, 2, true), block) << "each block keeps a mask of its own";
    const int64_t heads = c.family == Family::BLOOM ? c.n_heads : 1;  // ALiBi's bias masked: [B, H, T, T]
    if (c.sliding_window == 0) {
      EXPECT_EQ(kept(c, 2, true) - kept(c, 2, false), heads * mask);
      continue;
    }
    // A window attends in parts (attention_masks.h): the first w queries' mask [B, 1, w, w],
    // then the blocks' [B n, 1, R, R + w] (n R = T - w here), in place of the band [1, 1, R,
    // R + w] every block shares without documents.
    const int64_t w = c.sliding_window, r = window_block_rows(w);
    ASSERT_EQ((t - w) % r, 0);
    EXPECT_EQ(kept(c, 2, true) - kept(c, 2, false), (b * (w * w + (t - w) * (r + w)) - r * (r + w)) * 4);
  }
}

// Attention over a sliding window (model.sliding_window = w): each layer lets a token see
// the w - 1 tokens before it, so through L layers a changed token moves its own output
// and those of the L (w - 1) tokens after it, and no other. Outside that reach every
// input of every computation is the same bits (a masked key's weight is exp(-inf) = 0
// exactly), so those outputs are equal, not close; inside it they differ.
class SlidingWindow : public ::testing::TestWithParam<ModelConfig> {};

TEST_P(SlidingWindow, AChangedTokenReachesLayersTimesTheWindowLessOne) {
  ModelConfig c = GetParam();
  c.sliding_window = 4;
  torch::manual_seed(0);
  Transformer m(c);
  m->reset_parameters(5);
  m->eval();
  torch::NoGradGuard no_grad;
  const int64_t t = 24, at = 6, reach = c.n_layers * (c.sliding_window - 1);
  ASSERT_LT(at + reach + 1, t);
  const auto tokens = torch::randint(0, c.vocab_size, {1, t}, torch::kInt64);
  auto changed = tokens.clone();
  changed[0][at] = (tokens[0][at].item<int64_t>() + 1) % c.vocab_size;
  // Documents 0 up to position 9, then 1: the boundary cuts the reach short.
  auto documents = torch::zeros({1, t}, torch::kInt32);
  documents.narrow(1, 9, t - 9).fill_(1);
  const auto moved = [&](const torch::Tensor& docs) {
    return (m->hidden(tokens, docs) - m->hidden(changed, docs)).abs().amax({0, 2});  // [T]
  };
  const auto plain = moved({}), apart = moved(documents);
  for (int64_t i = 0; i < t; ++i) {
    const double p = plain[i].item<double>(), d = apart[i].item<double>();
    if (i >= at && i <= at + reach)
      EXPECT_GT(p, 0) << "position " << i << " is within reach";
    else
      EXPECT_EQ(p, 0) << "position " << i << " is out of reach";
    if (i >= at && i < 9)
      EXPECT_GT(d, 0) << "position " << i << " is within reach and the document";
    else
      EXPECT_EQ(d, 0) << "position " << i << " is out of reach or in another document";
  }
  // A window the sequence fits in is plain causal attention.
  ModelConfig wide = c;
  wide.sliding_window = t;
  Transformer w(wide);
  w->reset_parameters(5);
  w->eval();
  ModelConfig none = c;
  none.sliding_window = 0;
  Transformer n(none);
  n->reset_parameters(5);
  n->eval();
  EXPECT_TRUE(torch::equal(w->hidden(tokens), n->hidden(tokens)));
  EXPECT_FALSE(torch::equal(m->hidden(tokens), n->hidden(tokens)));
}

// Layers of two kinds (model.full_attention_layers): one layer attending in full carries
// a changed token to every later position of its document, windowed layers before or
// after it notwithstanding; every layer listed is attention without a window, and a
// RoPE base of the windowed layers' own (model.rope_local_theta) rotates those alone.
// Each comparison is of the same operations on the same bits: equal, not close.
TEST_P(SlidingWindow, AFullAttentionLayerReachesEveryLaterTokenAndTheLocalBaseOnlyTheWindowsLayers) {
  ModelConfig c = GetParam();
  c.sliding_window = 4;
  c.full_attention_layers = {c.n_layers - 1};
  const bool rope = c.positions == PositionKind::RoPE;
  if (rope) c.rope_local_theta = 500;
  const auto made = [](const ModelConfig& config) {
    Transformer m(config);
    m->reset_parameters(5);
    m->eval();
    return m;
  };
  Transformer m = made(c);
  torch::NoGradGuard no_grad;
  const int64_t t = 24, at = 6;
  const auto tokens = torch::randint(0, c.vocab_size, {1, t}, torch::kInt64);
  auto changed = tokens.clone();
  changed[0][at] = (tokens[0][at].item<int64_t>() + 1) % c.vocab_size;
  auto documents = torch::zeros({1, t}, torch::kInt32);
  documents.narrow(1, 18, t - 18).fill_(1);
  const auto moved = [&](const torch::Tensor& docs) {
    return (m->hidden(tokens, docs) - m->hidden(changed, docs)).abs().amax({0, 2});  // [T]
  };
  const auto plain = moved({}), apart = moved(documents);
  for (int64_t i = 0; i < t; ++i) {
    if (i >= at)
      EXPECT_GT(plain[i].item<double>(), 0) << "position " << i << " is after the change";
    else
      EXPECT_EQ(plain[i].item<double>(), 0) << "position " << i << " is before the change";
    if (i >= at && i < 18)
      EXPECT_GT(apart[i].item<double>(), 0) << "position " << i << " is after the change, in its document";
    else
      EXPECT_EQ(apart[i].item<double>(), 0) << "position " << i << " is before the change or in another document";
  }
  ModelConfig every = c, none = GetParam();
  for (int64_t i = 0; i + 1 < c.n_layers; ++i) every.full_attention_layers.push_back(i);
  EXPECT_TRUE(torch::equal(made(every)->hidden(tokens), made(none)->hidden(tokens)));
  ModelConfig windowed = c;
  windowed.full_attention_layers.clear();
  EXPECT_FALSE(torch::equal(m->hidden(tokens), made(windowed)->hidden(tokens)));
  if (!rope) return;
  ModelConfig rebased = windowed;  // every layer windowed: the local base is every layer's
  rebased.rope_theta = c.rope_local_theta;
  rebased.rope_local_theta = 0;
  EXPECT_TRUE(torch::equal(made(windowed)->hidden(tokens), made(rebased)->hidden(tokens)));
  ModelConfig one_base = windowed;
  one_base.rope_local_theta = 0;
  EXPECT_FALSE(torch::equal(made(windowed)->hidden(tokens), made(one_base)->hidden(tokens)));
}

INSTANTIATE_TEST_SUITE_P(Model, SlidingWindow,
                         ::testing::Values(tiny_llama(), tiny_bloom(), tiny_llama_with_learned_positions()),
                         [](const auto& info) {
                           if (info.param.positions == PositionKind::Learned) return std::string("learned_positions");
                           return std::string(info.param.family == Family::LLaMA ? "llama" : "bloom");
                         });

TEST(Model, HuggingFaceParameterNames) {
  Transformer l(tiny_llama());
  const auto ln = l->named_parameters();
  for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                           "model.layers.1.self_attn.k_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                           "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight",
                           "model.layers.0.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight",
                           "model.layers.0.post_attention_layernorm.weight", "model.norm.weight", "lm_head.weight"})
    EXPECT_NE(ln.find(name), nullptr) << name;
  EXPECT_EQ(ln["model.layers.0.self_attn.k_proj.weight"].size(0), 2 * 8);  // K heads * Hd
  Transformer b(tiny_bloom());
  const auto bn = b->named_parameters();
  for (const char* name : {"transformer.word_embeddings.weight", "transformer.word_embeddings_layernorm.bias",
                           "transformer.h.0.self_attention.query_key_value.weight",
                           "transformer.h.0.self_attention.dense.bias", "transformer.h.1.mlp.dense_h_to_4h.weight",
                           "transformer.h.1.mlp.dense_4h_to_h.bias", "transformer.ln_f.weight"})
    EXPECT_NE(bn.find(name), nullptr) << name;
  EXPECT_EQ(bn.find("lm_head.weight"), nullptr);  // tied
}

TEST(Model, AlibiSlopesOfBloom) {
  const auto s8 = alibi_slopes(8);
  for (int i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(s8[i], std::pow(2.0, -(i + 1)));
  // 12 heads: the 8-head sequence, then every other slope of the 16-head sequence.
  const auto s12 = alibi_slopes(12);
  ASSERT_EQ(s12.size(), 12u);
  for (int i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(s12[i], std::pow(2.0, -(i + 1)));
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(s12[8 + i], std::pow(2.0, -0.5 * (1 + 2 * i)));
  EXPECT_EQ(alibi_slopes(112).size(), 112u);
}

TEST(Model, RopeScoresDependOnlyOnRelativePosition) {
  // With RoPE, shifting the whole sequence changes no attention score: the model's
  // output on a sequence equals its output on the same tokens placed later when no
  // other position signal exists (causal mask only looks back).
  ModelConfig c = tiny_llama();
  c.n_layers = 1;
  Transformer m(c);
  m->eval();
  auto& attn = std::dynamic_pointer_cast<BlockImpl>((*m->blocks)[0])->attention;
  const int64_t hd = head_dim(c);
  torch::manual_seed(3);
  const auto x = torch::randn({1, 1, c.dim});
  // Same token at positions p and p+1 attending to itself: q·k = |q||k| cos(0) for any p.
  const auto q = attn->q_proj(x).view({1, 1, c.n_heads, hd}).transpose(1, 2);
  const int64_t half = hd / 2;
  auto rotate = [&](const torch::Tensor& t, int64_t pos) {
    auto inv = torch::pow(c.rope_theta, torch::arange(0, hd, 2, torch::kFloat64) / static_cast<double>(hd)).reciprocal();
    auto ang = torch::cat({inv, inv}) * static_cast<double>(pos);
    auto rh = torch::cat({-t.narrow(-1, half, half), t.narrow(-1, 0, half)}, -1);
    return t * ang.cos().to(torch::kFloat32) + rh * ang.sin().to(torch::kFloat32);
  };
  const auto s1 = (rotate(q, 3) * rotate(q, 1)).sum(-1);
  const auto s2 = (rotate(q, 10) * rotate(q, 8)).sum(-1);
  EXPECT_TRUE(torch::allclose(s1, s2, 1e-4, 1e-5));
}

TEST(Model, GroupedQueryEqualsMultiHeadWithRepeatedKeyValues) {
  ModelConfig g = tiny_llama();  // 4 query heads, 2 kv heads
  ModelConfig mha = g;
  mha.n_kv_heads = 4;
  Transformer a(g), b(mha);
  a->eval();
  b->eval();
  const int64_t hd = head_dim(g);
  {
    torch::NoGradGuard ng;
    auto pa = a->named_parameters();
    for (auto& item : b->named_parameters()) {
      const auto& src = pa[item.key()];
      if (item.key().find("k_proj") != std::string::npos || item.key().find("v_proj") != std::string::npos) {
        // Expand each kv head to the query heads that share it.
        item.value().copy_(src.view({2, 1, hd, g.dim}).expand({2, 2, hd, g.dim}).reshape({4 * hd, g.dim}));
      } else {
        item.value().copy_(src);
      }
    }
  }
  const auto tokens = torch::randint(0, g.vocab_size, {2, 12}, torch::kInt64);
  EXPECT_TRUE(torch::allclose(a->forward(tokens), b->forward(tokens), 1e-5, 1e-5));
}

TEST(Model, AlibiAttentionMatchesTheFormula) {
  // Zero query/key weights leave only the ALiBi bias in the scores, so head h's output
  // at position i must be sum_j softmax_j(slope_h * (j - i)) * v_j over j <= i.
  ModelConfig c = tiny_bloom();
  Transformer m(c);
  auto attn = std::dynamic_pointer_cast<BlockImpl>((*m->blocks)[0])->attention;
  const int64_t h = c.n_heads, hd = head_dim(c), t = 7;
  torch::NoGradGuard ng;
  auto w = attn->qkv->weight.view({h, 3, hd, c.dim});
  w.select(1, 0).zero_();
  w.select(1, 1).zero_();
  attn->qkv->bias.zero_();
  attn->out->weight.copy_(torch::eye(c.dim));
  attn->out->bias.zero_();
  const auto x = torch::randn({1, t, c.dim});
  const auto y = attn->forward(x, m->attention_bias(t, x.options()), {}, {});
  const auto v = torch::matmul(x, w.select(1, 2).reshape({h * hd, c.dim}).t()).view({t, h, hd});
  const auto slopes = alibi_slopes(h);
  for (int64_t head = 0; head < h; ++head)
    for (int64_t i = 0; i < t; ++i) {
      std::vector<double> p(static_cast<size_t>(i + 1));
      double z = 0;
      for (int64_t j = 0; j <= i; ++j) z += (p[j] = std::exp(slopes[head] * static_cast<double>(j - i)));
      auto expected = torch::zeros({hd});
      for (int64_t j = 0; j <= i; ++j) expected += v[j][head] * (p[j] / z);
      EXPECT_TRUE(torch::allclose(y[0][i].narrow(0, head * hd, hd), expected, 1e-4, 1e-5)) << head << "," << i;
    }
}

}  // namespace
}  // namespace tide
