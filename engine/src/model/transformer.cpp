#include "tide/engine/model/transformer.h"

#include <cmath>
#include <limits>

#include <torch/torch.h>
#include <xxhash.h>

#include "tide/engine/model/linear_cross_entropy.h"
#include "tide/engine/model/parameter_units.h"
#include "recompute.h"

namespace tide {

std::vector<double> alibi_slopes(int64_t n_heads) {
  // BLOOM: slopes form a geometric sequence for the largest power of two <= H; the
  // remaining heads take every other slope of the sequence for twice that power.
  const int64_t closest = int64_t{1} << static_cast<int>(std::floor(std::log2(static_cast<double>(n_heads))));
  const double base = std::pow(2.0, -std::pow(2.0, -(std::log2(static_cast<double>(closest)) - 3.0)));
  std::vector<double> slopes;
  for (int64_t i = 1; i <= closest; ++i) slopes.push_back(std::pow(base, static_cast<double>(i)));
  if (closest != n_heads) {
    const double extra = std::pow(2.0, -std::pow(2.0, -(std::log2(2.0 * static_cast<double>(closest)) - 3.0)));
    const int64_t remaining = std::min(closest, n_heads - closest);
    for (int64_t i = 0; i < remaining; ++i) slopes.push_back(std::pow(extra, static_cast<double>(1 + 2 * i)));
  }
  return slopes;
}

bool is_decayed(const std::string& name, const torch::Tensor& param, bool decay_norms_and_biases,
                bool decay_embeddings) {
  const bool embedding = name.find("embed") != std::string::npos || name.find("word_embeddings.weight") != std::string::npos;
  if (param.dim() < 2) return decay_norms_and_biases;
  if (embedding) return decay_embeddings;
  return true;
}

namespace {
std::shared_ptr<torch::nn::Module> holder_of(const std::string& name, torch::Tensor value, torch::Tensor& out,
                                             torch::nn::Module& parent) {
  auto m = std::make_shared<torch::nn::Module>();
  out = m->register_parameter("weight", std::move(value));
  parent.register_module(name, m);
  return m;
}
}  // namespace

TransformerImpl::TransformerImpl(const ModelConfig& cfg) : cfg_(cfg) {
  const bool bloom = cfg.family == Family::BLOOM;
  auto backbone = std::make_shared<torch::nn::Module>();
  holder_of(bloom ? "word_embeddings" : "embed_tokens", torch::empty({cfg.vocab_size, cfg.dim}), tok_embeddings,
            *backbone);
  if (cfg.positions == PositionKind::Learned)
    holder_of(bloom ? "word_position_embeddings" : "embed_positions", torch::empty({cfg.max_seq_len, cfg.dim}),
              pos_embeddings, *backbone);
  if (cfg.embedding_norm)
    embedding_norm =
        backbone->register_module("word_embeddings_layernorm", Norm(NormKind::LayerNorm, cfg.dim, cfg.norm_eps));
  blocks = torch::nn::ModuleList();
  for (int64_t i = 0; i < cfg.n_layers; ++i) blocks->push_back(Block(cfg));
  backbone->register_module(bloom ? "h" : "layers", blocks);
  final_norm = backbone->register_module(bloom ? "ln_f" : "norm", Norm(cfg.norm, cfg.dim, cfg.norm_eps));
  register_module(bloom ? "transformer" : "model", backbone);
  if (!cfg.tie_embeddings) holder_of("lm_head", torch::empty({cfg.vocab_size, cfg.dim}), lm_head, *this);

  if (cfg.positions == PositionKind::RoPE) {
    const int64_t hd = head_dim(cfg);
    const auto inv_freq =
        torch::pow(cfg.rope_theta, torch::arange(0, hd, 2, torch::kFloat64) / static_cast<double>(hd)).reciprocal();
    const auto freqs = torch::outer(torch::arange(cfg.max_seq_len, torch::kFloat64), inv_freq);
    const auto emb = torch::cat({freqs, freqs}, -1);  // [max_seq_len, Hd]
    rope_cos_ = emb.cos().to(torch::kFloat32);
    rope_sin_ = emb.sin().to(torch::kFloat32);
  } else if (cfg.positions == PositionKind::ALiBi) {
    const auto s = alibi_slopes(cfg.n_heads);
    alibi_slopes_ = torch::tensor(s, torch::kFloat64).to(torch::kFloat32);
  }
  reset_parameters(0);
}

void TransformerImpl::reset_parameters(uint64_t seed) {
  torch::NoGradGuard no_grad;
  const double residual_std = cfg_.init_std / std::sqrt(2.0 * static_cast<double>(cfg_.n_layers));
  for (auto& item : named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    const bool is_bias = name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0;
    if (is_bias) {
      p.zero_();
    } else if (p.dim() == 1) {
      p.fill_(1.0);  // norm weights
    } else {
      const bool residual_out = name.find("o_proj") != std::string::npos ||
                                name.find("down_proj") != std::string::npos ||
                                name.find("dense_4h_to_h") != std::string::npos ||
                                name.find("self_attention.dense") != std::string::npos;
      const double std = cfg_.scale_residual_init && residual_out ? residual_std : cfg_.init_std;
      const uint64_t s = XXH3_64bits_withSeed(name.data(), name.size(), seed);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(s);
      auto tmp = torch::empty(p.sizes(), torch::kFloat32);
      tmp.normal_(0.0, std, gen);
      p.copy_(tmp);
    }
  }
}

const torch::Tensor& TransformerImpl::output_weight() const { return lm_head.defined() ? lm_head : tok_embeddings; }

torch::Tensor TransformerImpl::attention_bias(int64_t t, const torch::TensorOptions& options) {
  const auto opts = options.requires_grad(false);
  // Every forward of a run asks for the same mask: build it once.
  if (bias_cache_.defined() && bias_cache_.size(-1) == t && bias_cache_.dtype() == opts.dtype() &&
      bias_cache_.device() == opts.device())
    return bias_cache_;
  const auto pos = torch::arange(t, opts);
  const auto distance = pos.unsqueeze(0) - pos.unsqueeze(1);  // [T, T]: j - i
  const auto future = distance.gt(0);
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (!alibi_slopes_.defined()) return bias_cache_ = torch::zeros({t, t}, opts).masked_fill_(future, neg_inf);
  // ALiBi: slope_h * (j - i) for j <= i. Softmax is shift-invariant per row, so this
  // equals BLOOM's slope_h * j.
  const auto slopes = alibi_slopes_.to(opts.device(), opts.dtype()).view({-1, 1, 1});
  return bias_cache_ = (slopes * distance.unsqueeze(0)).masked_fill_(future.unsqueeze(0), neg_inf);  // [H, T, T]
}

torch::Tensor TransformerImpl::hidden(const torch::Tensor& tokens) {
  const int64_t t = tokens.size(1);
  TORCH_CHECK(t <= cfg_.max_seq_len, "sequence of ", t, " tokens exceeds model.max_seq_len = ", cfg_.max_seq_len);
  if (units_) units_->before_forward(0);
  auto x = torch::embedding(tok_embeddings, tokens);  // [B, T, D]
  if (pos_embeddings.defined()) x = x + pos_embeddings.narrow(0, 0, t);
  if (embedding_norm) x = embedding_norm(x);
  if (cfg_.dropout > 0 && is_training()) x = torch::dropout(x, cfg_.dropout, true);
  const auto bias = attention_bias(t, x.options());
  torch::Tensor cos, sin;
  if (rope_cos_.defined()) {
    if (rope_cos_.device() != x.device()) {
      rope_cos_ = rope_cos_.to(x.device());
      rope_sin_ = rope_sin_.to(x.device());
    }
    cos = rope_cos_.narrow(0, 0, t).to(x.scalar_type());
    sin = rope_sin_.narrow(0, 0, t).to(x.scalar_type());
  }
  const bool recompute = cfg_.activation_checkpointing && is_training() && torch::GradMode::is_enabled();
  int unit = 0;
  for (const auto& module : *blocks) {
    auto block = std::dynamic_pointer_cast<BlockImpl>(module);
    ++unit;
    if (units_) units_->before_forward(unit);
    if (recompute) {
      x = recompute_in_backward([block, bias, cos, sin](const at::Tensor& in) { return block->forward(in, bias, cos, sin); },
                                x);
    } else {
      x = block->forward(x, bias, cos, sin);
    }
    if (units_) x = units_->after_forward(unit, x);
  }
  return final_norm(x);
}

torch::Tensor TransformerImpl::forward(const torch::Tensor& tokens) {
  auto logits = torch::matmul(hidden(tokens), output_weight().t());  // [B, T, V]
  if (units_ && !torch::GradMode::is_enabled()) units_->end_forward();
  return logits;
}

torch::Tensor TransformerImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  const auto h = hidden(tokens);
  auto loss = linear_cross_entropy(h.reshape({-1, cfg_.dim}), output_weight(), targets.reshape({-1}));
  if (units_ && !torch::GradMode::is_enabled()) units_->end_forward();
  return loss;
}

}  // namespace tide
