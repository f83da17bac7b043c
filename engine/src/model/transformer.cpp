#include "tide/engine/model/transformer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include <torch/types.h>
#include <xxhash.h>

#include "model/moe_pass.h"
#include "model/normal_draw.h"
#include "model/tensor_storage.h"
#include "recompute.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/linear_cross_entropy.h"
#include "tide/engine/model/parameter_names.h"
#include "tide/engine/model/parameter_units.h"
#include "tide/engine/run_layout.h"

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

std::vector<double> rope_inverse_frequencies(const ModelConfig& m) {
  constexpr double kPi = 3.14159265358979323846;
  const int64_t hd = head_dim(m);
  const double factor = m.rope_scaling_factor, low = m.rope_low_freq_factor, high = m.rope_high_freq_factor;
  const auto original = static_cast<double>(m.rope_original_max_seq_len);
  // YaRN: the dimension (of hd) whose frequency turns `rotations` times over the original
  // context; the ramp runs between those of beta_fast and beta_slow, rounded outwards and
  // held inside [0, hd - 1], as transformers' truncated range is.
  const auto dimension_turning = [&](double rotations) {
    return static_cast<double>(hd) * std::log(original / (rotations * 2 * kPi)) / (2 * std::log(m.rope_theta));
  };
  const double ramp_low = std::max(0.0, std::floor(dimension_turning(m.rope_beta_fast)));
  double ramp_high = std::min(static_cast<double>(hd - 1), std::ceil(dimension_turning(m.rope_beta_slow)));
  if (ramp_high == ramp_low) ramp_high += 0.001;  // transformers' guard against a zero-width ramp
  std::vector<double> out;
  for (int64_t i = 0; i < hd; i += 2) {
    double f = 1.0 / std::pow(m.rope_theta, static_cast<double>(i) / static_cast<double>(hd));
    if (m.rope_scaling == RopeScaling::Yarn) {
      const int64_t pair = i / 2;  // the frequency's index
      const double ramp = std::clamp((static_cast<double>(pair) - ramp_low) / (ramp_high - ramp_low), 0.0, 1.0);
      f = ramp * f / factor + (1 - ramp) * f;  // ramp 0: kept (fast turning), 1: divided
    } else if (m.rope_scaling == RopeScaling::Linear) {
      f /= factor;
    } else if (m.rope_scaling == RopeScaling::Llama3) {
      // Llama 3.1: a wavelength longer than the pretrained context / low is stretched by the
      // factor, one shorter than context / high kept; between, the two mixed by where the
      // context / wavelength ratio lies between low and high.
      const double wavelength = 2 * kPi / f;
      if (wavelength > original / low) {
        f /= factor;
      } else if (wavelength >= original / high) {
        const double smooth = (original / wavelength - low) / (high - low);
        f = (1 - smooth) * f / factor + smooth * f;
      }
    }
    out.push_back(f);
  }
  return out;
}

double rope_attention_scale(const ModelConfig& m) {
  if (m.rope_scaling != RopeScaling::Yarn) return 1.0;
  if (m.rope_attention_factor > 0) return m.rope_attention_factor;
  return m.rope_scaling_factor <= 1 ? 1.0 : 0.1 * std::log(m.rope_scaling_factor) + 1.0;
}

namespace {
// [B, T] int64: each token's distance from its document's first token in the row.
torch::Tensor positions_in_documents(const torch::Tensor& documents) {
  const auto index = torch::arange(documents.size(1), documents.options().dtype(torch::kInt64)).expand_as(documents);
  auto starts = documents.ne(documents.roll(1, 1));
  starts.select(1, 0).fill_(true);
  const auto first = std::get<0>(torch::where(starts, index, torch::zeros_like(index)).cummax(1));
  return index - first;
}

std::shared_ptr<torch::nn::Module> holder_of(const std::string& name, torch::Tensor value, torch::Tensor& out,
                                             torch::nn::Module& parent) {
  auto m = std::make_shared<torch::nn::Module>();
  out = m->register_parameter("weight", std::move(value));
  parent.register_module(name, m);
  return m;
}
}  // namespace

TransformerImpl::TransformerImpl(const ModelConfig& cfg, TensorParallel tp, PipelineStage stage,
                                 ParameterStorage storage, ExpertParallel ep)
    : cfg_(cfg), tp_(std::move(tp)), ep_(std::move(ep)), stage_(std::move(stage)) {
  const bool deferred = storage == ParameterStorage::Deferred;
  std::optional<DeferredStorage> shapes_only;  // every parameter made without memory
  if (deferred) shapes_only.emplace();
  if (!tp_.group) tp_ = TensorParallel{};
  TORCH_CHECK(!stage_.chunks.empty(), "a pipeline stage without blocks");
  int64_t previous_end = 0;
  for (auto& c : stage_.chunks) {
    if (c.end < 0) c.end = cfg.n_layers;
    TORCH_CHECK(previous_end <= c.first && c.first <= c.end && c.end <= cfg.n_layers, "pipeline stage blocks [",
                c.first, ", ", c.end, ") outside the model's ", cfg.n_layers, " or out of order");
    previous_end = c.end;
  }
  check_tensor_parallel(cfg, tp_.size(), false, 0);
  vocab_local_ = padded_vocab(cfg.vocab_size, tp_.size()) / tp_.size();
  vocab_first_ = tp_.rank() * vocab_local_;
  const auto sp = tp_.sequence_parallel ? tp_.group : nullptr;
  const bool bloom = cfg.family == Family::BLOOM;
  auto backbone = std::make_shared<torch::nn::Module>();
  // The last stage's copy of tied embeddings has the first stage's name (and values).
  if (stage_.first || (stage_.last && cfg.tie_embeddings))
    holder_of(bloom ? "word_embeddings" : "embed_tokens", parameter_tensor({vocab_local_, cfg.dim}), tok_embeddings,
              *backbone);
  if (stage_.first && cfg.positions == PositionKind::Learned)
    holder_of(bloom ? "word_position_embeddings" : "embed_positions", parameter_tensor({cfg.max_seq_len, cfg.dim}),
              pos_embeddings, *backbone);
  if (stage_.first && cfg.embedding_norm)
    embedding_norm = backbone->register_module(
        "word_embeddings_layernorm", Norm(NormKind::LayerNorm, cfg.dim, cfg.norm_eps, cfg.norm_zero_centered, sp));
  // Blocks keep their index in the whole model in their names ("model.layers.5.…").
  blocks = torch::nn::ModuleList();
  auto layers = std::make_shared<torch::nn::Module>();
  for (const auto& c : stage_.chunks) {
    for (int64_t i = c.first; i < c.end; ++i) {
      Block block(cfg, tp_, ep_);
      blocks->push_back(block);
      layers->register_module(std::to_string(i), block);
    }
  }
  backbone->register_module(bloom ? "h" : "layers", layers);
  if (stage_.last)
    final_norm = backbone->register_module(bloom ? "ln_f" : "norm",
                                           Norm(cfg.norm, cfg.dim, cfg.norm_eps, cfg.norm_zero_centered, sp));
  register_module(bloom ? "transformer" : "model", backbone);
  if (stage_.last && !cfg.tie_embeddings)
    holder_of("lm_head", parameter_tensor({vocab_local_, cfg.dim}), lm_head, *this);

  windowed_.window = cfg.sliding_window;
  if (cfg.positions == PositionKind::RoPE) {
    // The cos/sin tables are made for the positions used (block_inputs), not for
    // max_seq_len: a long context limit costs nothing until sequences reach it.
    full_.rope_inv_freq = torch::tensor(rope_inverse_frequencies(cfg), torch::kFloat64);
    full_.rope_scale = rope_attention_scale(cfg);
    const ModelConfig local = windowed_rope(cfg);
    windowed_.rope_inv_freq = torch::tensor(rope_inverse_frequencies(local), torch::kFloat64);
    windowed_.rope_scale = rope_attention_scale(local);
  } else if (cfg.positions == PositionKind::ALiBi) {
    const auto s = alibi_slopes(cfg.n_heads);
    const int64_t heads = cfg.n_heads / tp_.size();  // this rank's heads
    alibi_slopes_ = torch::tensor(s, torch::kFloat64).narrow(0, tp_.rank() * heads, heads).to(torch::kFloat32);
  }
  shapes_only.reset();
  // LoRA: the adapters alone train; autograd computes no gradient of anything else.
  if (cfg.lora_rank > 0)
    for (auto& item : named_parameters())
      if (!is_lora_parameter(item.key())) item.value().requires_grad_(false);
  if (!deferred) reset_parameters(0);
}

TpSlice TransformerImpl::tp_slice(const std::string& name) const {
  TpSlice out;
  if (tp_.size() == 1 || is_expert_bias(name)) return out;
  if (ends_with(name, "embed_tokens.weight") || ends_with(name, "word_embeddings.weight") || name == "lm_head.weight")
    return {0, vocab_first_, vocab_local_, vocab_local_ * tp_.size(), cfg_.vocab_size};
  auto split = [&](int dim) {
    const auto params = named_parameters(true);
    const auto* p = params.find(name);
    TORCH_CHECK(p, "no parameter ", name);
    const int64_t n = p->size(dim);
    return TpSlice{dim, tp_.rank() * n, n, n * tp_.size(), n * tp_.size()};
  };
  // A projection's parameters by the module they belong to: a column-parallel layer
  // splits its output rows (weight, bias, LoRA's B) and holds LoRA's A whole; a
  // row-parallel one splits its input columns (weight, LoRA's A) and holds its bias and
  // LoRA's B whole (layers.cpp says how each whole one's gradient is summed).
  const bool lora_a = ends_with(name, ".lora_A.weight");
  const bool weight = !is_lora_parameter(name) && ends_with(name, ".weight");
  switch (projection_split(cfg_, block_module_of(name), tp_.size())) {
    case ProjectionSplit::Column: return lora_a ? out : split(0);
    case ProjectionSplit::Row: return weight || lora_a ? split(1) : out;
    case ProjectionSplit::Whole: break;
  }
  return out;
}

torch::Tensor TransformerImpl::whole_parameter(const std::string& name) {
  torch::NoGradGuard no_grad;
  if (is_expert_bias(name)) {  // a buffer, whole on every rank
    const auto buffers = named_buffers();
    const auto* held = buffers.find(name);
    TORCH_CHECK(held, "no buffer ", name);
    return *held;
  }
  const auto params = named_parameters();
  const auto* local = params.find(name);
  TORCH_CHECK(local, "no parameter ", name);
  const TpSlice slice = tp_slice(name);
  if (slice.dim < 0) return *local;
  const auto all = tp_.group->all_gather(*local, "whole parameter " + name);
  std::vector<int64_t> shape{tp_.size()};
  for (const auto d : local->sizes()) shape.push_back(d);
  auto whole = torch::cat(all.view(shape).unbind(0), slice.dim);
  return slice.valid < slice.whole ? whole.narrow(slice.dim, 0, slice.valid) : whole;
}

void TransformerImpl::reset_parameters(uint64_t seed) {
  for (auto& item : named_parameters()) initialise_parameter(item.key(), item.value(), seed);
}

void TransformerImpl::initialise_parameter(const std::string& name, const torch::Tensor& into, uint64_t seed,
                                           int64_t first) const {
  torch::NoGradGuard no_grad;
  const auto params = named_parameters();
  const auto* p = params.find(name);
  TORCH_CHECK(p, "no parameter ", name);
  const int64_t n = into.numel();
  TORCH_CHECK(first >= 0 && first + n <= p->numel(), "elements [", first, ", ", first + n, ") of ", name, " with ",
              p->numel());
  if (ends_with(name, "bias") || ends_with(name, ".lora_B.weight")) {  // LoRA starts as no change at all
    into.zero_();
    return;
  }
  if (p->dim() == 1) {
    into.fill_(cfg_.norm_zero_centered ? 0.0 : 1.0);  // norm weights: a scale of 1
    return;
  }
  TORCH_CHECK(p->dim() == 2, "no initialisation for ", name, " of ", p->dim(), " dimensions");
  const bool residual_out = projection_split(cfg_, block_module_of(name), 1) == ProjectionSplit::Row;
  // LoRA's A: the spread of PEFT's and torchtune's kaiming_uniform(a = sqrt(5)), whose
  // uniform draws within 1 / sqrt(in) have a deviation of 1 / sqrt(3 in), here as a
  // normal draw (a pure function of the seed, the name and the index, as every weight).
  const bool lora_a = ends_with(name, ".lora_A.weight");
  const TpSlice slice = tp_slice(name);
  const int64_t whole_in = slice.dim == 1 ? slice.whole : p->size(1);  // a row-parallel A holds a part of `in`
  const double std = lora_a ? 1.0 / std::sqrt(3.0 * static_cast<double>(whole_in))
                     : cfg_.scale_residual_init && residual_out
                         ? cfg_.init_std / std::sqrt(2.0 * static_cast<double>(cfg_.n_layers))
                         : cfg_.init_std;
  const uint64_t key = XXH3_64bits_withSeed(name.data(), name.size(), seed);
  // Drawn straight into `into` where it is a host fp32 array, else through one.
  const bool direct = into.is_cpu() && into.is_contiguous() && into.scalar_type() == torch::kFloat32;
  const auto out = direct ? into : torch::empty({n}, torch::kFloat32);
  float* data = out.data_ptr<float>();
  // Element (r, c) of this rank's [rows, cols] tensor is element (r + r0, c + c0) of the
  // whole [.., whole_cols] one; rows from `valid` on are the vocabulary's padding.
  const int64_t cols = p->size(1);
  const int64_t r0 = slice.dim == 0 ? slice.first : 0, c0 = slice.dim == 1 ? slice.first : 0;
  const int64_t whole_cols = slice.dim == 1 ? slice.whole : cols;
  const int64_t valid = slice.dim == 0 ? slice.valid - r0 : p->size(0);  // local rows that hold values
  if (slice.dim != 1) {  // the rows are consecutive in the whole tensor: one range
    const int64_t drawn = std::clamp<int64_t>(valid * cols - first, 0, n);
    draw_normal(key, std, r0 * cols + first, data, drawn);
    std::fill(data + drawn, data + n, 0.0f);
  } else {
    for (int64_t i = 0; i < n;) {
      const int64_t r = (first + i) / cols, c = (first + i) % cols, run = std::min(cols - c, n - i);
      draw_normal(key, std, r * whole_cols + c0 + c, data + i, run);
      i += run;
    }
  }
  if (!direct) into.copy_(out.view(into.sizes()));
}

const torch::Tensor& TransformerImpl::output_weight() const { return lm_head.defined() ? lm_head : tok_embeddings; }

std::set<std::string> TransformerImpl::weights_read_in_compute_dtype() const {
  std::set<std::string> out;
  if (lm_head.defined()) out.insert("lm_head.weight");
  const auto modules = named_modules();
  for (const auto& item : modules)
    if (const auto* p = dynamic_cast<const ProjectionImpl*>(item.value().get())) {
      out.insert(item.key() + ".weight");
      if (p->adapted()) out.insert({item.key() + ".lora_A.weight", item.key() + ".lora_B.weight"});
    }
  // The router reads its fp32 weight (moe_layer.cpp).
  for (const auto& item : modules)
    if (dynamic_cast<const MoeImpl*>(item.value().get())) out.erase(item.key() + ".gate.weight");
  for (const auto& item : modules)
    if (const auto* a = dynamic_cast<const AttentionImpl*>(item.value().get()); a && a->reads_key_value_whole()) {
      out.erase(item.key() + ".k_proj.weight");
      out.erase(item.key() + ".v_proj.weight");
    }
  return out;
}

void TransformerImpl::set_context_parallel(ContextParallel cp) {
  cp_ = std::move(cp);
  // Split by heads, this rank attends with its share of them: ALiBi's masks carry those
  // heads' slopes.
  if (cp_.by_heads() && alibi_slopes_.defined()) {
    const HeadShare share = context_head_share(alibi_slopes_.size(0), cp_.rank(), cp_.size());
    alibi_slopes_ = alibi_slopes_.narrow(0, share.first, share.count);
  }
}

torch::Tensor TransformerImpl::attention_bias(int64_t t, const torch::TensorOptions& options) {
  return bias_of(full_, t, options);
}

torch::Tensor TransformerImpl::bias_of(LayerAttention& kind, int64_t t, const torch::TensorOptions& options) {
  // Causal attention alone needs no mask: the attention kernel is told it is causal, and
  // skips the masked half (on CUDA the flash kernel).
  if (!alibi_slopes_.defined()) return {};
  const auto opts = options.requires_grad(false);
  // Every forward of a run asks for the same bias: build it once.
  auto& cache = kind.bias_cache;
  if (cache.defined() && cache.size(-1) == t && cache.dtype() == opts.dtype() && cache.device() == opts.device())
    return cache;
  // ALiBi's bias, -inf above the diagonal, rounded once to the stream's dtype. Four
  // dimensions: the host's flash kernel takes a mask only in that form.
  const auto future = allowed_keys(t, t, 0, opts.device()).logical_not();
  const auto bias = alibi_distances(alibi_slopes_, t, t, opts.device()).masked_fill_(future, kMaskedScore);
  return cache = bias.to(opts.dtype());
}

std::shared_ptr<const WindowedAttention> TransformerImpl::window_of(LayerAttention& kind, int64_t t,
                                                                    const torch::TensorOptions& options,
                                                                    const torch::Tensor& documents) {
  const int64_t window = kind.window_for(t), rows = window_block_rows(window);
  if (documents.defined())
    return std::make_shared<WindowedAttention>(
        windowed_attention_parts(t, window, rows, documents, alibi_slopes_, options));
  // Without documents every forward of a run asks for the same parts. Since t > w there is
  // a part after the first, and it has a mask: its dtype and device are the parts'.
  auto& cache = kind.window_cache;
  if (cache && cache->t == t && cache->parts.back().mask.dtype() == options.dtype() &&
      cache->parts.back().mask.device() == options.device())
    return cache;
  return cache =
             std::make_shared<WindowedAttention>(windowed_attention_parts(t, window, rows, {}, alibi_slopes_, options));
}

std::shared_ptr<const ContextAttention> TransformerImpl::context_of(LayerAttention& kind, int64_t t,
                                                                    const torch::TensorOptions& options,
                                                                    const torch::Tensor& documents) {
  const int64_t window = kind.window_for(t);
  if (documents.defined())
    return std::make_shared<ContextAttention>(
        context_attention_chunks(cp_, t, window, documents, alibi_slopes_, options));
  // Without documents every forward of a run asks for the same chunks.
  auto& cache = kind.context_cache;
  if (cache && cache->t == t && cache->options.dtype() == options.dtype() &&
      cache->options.device() == options.device())
    return cache;
  return cache =
             std::make_shared<ContextAttention>(context_attention_chunks(cp_, t, window, {}, alibi_slopes_, options));
}

TransformerImpl::BlockInputs TransformerImpl::block_inputs(LayerAttention& kind, const torch::Tensor& x, int64_t t,
                                                           const torch::Tensor& documents) {
  BlockInputs in;
  if (documents.defined())
    TORCH_CHECK(documents.dim() == 2 && documents.size(0) == x.size(0) && documents.size(1) == t, "documents of shape ",
                documents.sizes(), " for a batch of ", x.size(0), " sequences of ", t, " tokens");
  // RoPE and ALiBi see only position differences, the same within a document wherever
  // it sits in the row: the mask alone makes each document attend as if it came first.
  // All-to-all context parallelism attends the whole sequence for a share of the heads:
  // the masks of one process.
  if (cp_.by_heads()) in.mask.by_heads = std::make_shared<const ContextParallel>(cp_);
  if (cp_.group && !cp_.by_heads()) {
    // This rank's chunks of the sequence, each over the keys it sees (window, documents
    // and ALiBi in its mask).
    in.mask.context = context_of(kind, t, x.options(), documents);
  } else if (kind.window_for(t) > 0) {
    // A window shorter than the sequence: attended in parts that leave out what it does.
    in.mask.windowed = window_of(kind, t, x.options(), documents);
  } else {
    in.mask.bias = bias_of(kind, t, x.options());
    if (documents.defined()) {
      const auto same = documents.unsqueeze(2).eq(documents.unsqueeze(1));  // [B, T, T]: doc_i == doc_j
      const auto allowed = same.logical_and_(allowed_keys(t, t, 0, x.device())).unsqueeze(1);
      in.mask.bias = in.mask.bias.defined() ? in.mask.bias.masked_fill(allowed.logical_not(), kMaskedScore)
                                            : additive_mask(allowed, x.options());
    }
  }
  if (!kind.rope_inv_freq.defined()) return in;
  if (!kind.rope_cos.defined() || kind.rope_cos.size(0) < t) {
    // Each row depends on its position alone: a table grown later holds the same values
    // in its first rows. Doubling keeps token-by-token sampling from rebuilding it at
    // every token.
    const int64_t rows =
        std::min(cfg_.max_seq_len, std::max(t, 2 * (kind.rope_cos.defined() ? kind.rope_cos.size(0) : 0)));
    const auto freqs = torch::outer(torch::arange(rows, torch::kFloat64), kind.rope_inv_freq);
    const auto emb = torch::cat({freqs, freqs}, -1);  // [rows, Hd]
    // YaRN scales both, so the scores grow by its square (1 elsewhere).
    kind.rope_cos = (emb.cos() * kind.rope_scale).to(torch::kFloat32);
    kind.rope_sin = (emb.sin() * kind.rope_scale).to(torch::kFloat32);
  }
  if (kind.rope_cos.device() != x.device()) {
    kind.rope_cos = kind.rope_cos.to(x.device());
    kind.rope_sin = kind.rope_sin.to(x.device());
  }
  if (cp_.group) {  // the rows of this rank's positions
    const auto positions =
        in.mask.context ? in.mask.context->positions : context_positions(t, cp_.rank(), cp_.size(), x.device());
    in.cos = kind.rope_cos.index_select(0, positions).to(x.scalar_type());
    in.sin = kind.rope_sin.index_select(0, positions).to(x.scalar_type());
  } else {
    in.cos = kind.rope_cos.narrow(0, 0, t).to(x.scalar_type());
    in.sin = kind.rope_sin.narrow(0, 0, t).to(x.scalar_type());
  }
  return in;
}

torch::Tensor TransformerImpl::embed(const torch::Tensor& whole_tokens, const torch::Tensor& documents) {
  const int64_t t = whole_tokens.size(1);
  TORCH_CHECK(t <= cfg_.max_seq_len, "sequence of ", t, " tokens exceeds model.max_seq_len = ", cfg_.max_seq_len);
  if (units_) units_->before_forward(0);
  const auto tokens = context_slice(whole_tokens, 1, cp_);  // this rank's (context parallelism)
  torch::Tensor x;  // [B, L, D] (L = T / cp, this rank's tokens), or [B, L / tp, D] with sequence parallelism
  int64_t first_position = 0;
  if (tp_.size() > 1) {
    // Each rank looks up the tokens of its vocabulary slice; the sum over ranks has them all.
    const auto local = tokens - vocab_first_;
    const auto outside = local.lt(0).logical_or_(local.ge(vocab_local_));
    x = torch::embedding(tok_embeddings, local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0);
    if (tp_.sequence_parallel) {
      x = tp_.group->reduce_scatter_sequence(x);
      first_position = tp_.rank() * x.size(1);
    } else {
      x = tp_.group->reduce_from(x);
    }
  } else {
    x = torch::embedding(tok_embeddings, tokens);
  }
  if (cfg_.embedding_scale != 1.0) x = x * cfg_.embedding_scale;
  if (pos_embeddings.defined()) {
    const auto table = tp_.sequence_parallel ? tp_.group->copy_to(pos_embeddings) : pos_embeddings;
    if (documents.defined())
      x = x + torch::embedding(
                  table, context_slice(positions_in_documents(documents), 1, cp_).narrow(1, first_position, x.size(1)));
    else if (cp_.group)  // the rows of this rank's positions
      x = x + torch::embedding(
                  table,
                  context_positions(t, cp_.rank(), cp_.size(), tokens.device()).narrow(0, first_position, x.size(1)));
    else
      x = x + table.narrow(0, first_position, x.size(1));
  }
  if (embedding_norm) x = embedding_norm(x);
  if (cfg_.dropout > 0 && is_training()) x = torch::dropout(x, cfg_.dropout, true);
  if (units_) x = units_->after_forward(0, x);
  return x;
}

torch::Tensor TransformerImpl::run_blocks(torch::Tensor x, size_t chunk, const torch::Tensor& documents) {
  // Under bf16 compute the residual stream is bf16 (norm statistics stay fp32), as it is
  // in Megatron-Core and torchtitan: half the activation memory and traffic.
  x = in_compute_dtype(x);
  // Attention sees the whole sequence, also when the residual stream is split (along it
  // over the tensor-parallel ranks, and over the context-parallel ones).
  const int64_t t = x.size(1) * (tp_.sequence_parallel ? tp_.size() : 1) * cp_.size();
  const bool recompute = is_training() && torch::GradMode::is_enabled();
  const bool blocks_draw = (cfg_.dropout > 0 || (cfg_.lora_rank > 0 && cfg_.lora_dropout > 0)) && is_training();
  // The chunk's blocks sit in `blocks` after those of the chunks before it.
  size_t at = 0;
  for (size_t c = 0; c < chunk; ++c) at += static_cast<size_t>(stage_.chunks[c].end - stage_.chunks[c].first);
  const BlockRange& range = stage_.chunks.at(chunk);
  const int64_t recomputed = recompute ? recomputed_blocks(cfg_, range) : 0;
  // A training pass's blocks report to its loss (moe_pass.h), one pass a call: a
  // pipeline stage runs each micro-batch's chunk apart.
  std::shared_ptr<MoePass> pass;
  if (cfg_.moe_experts > 0 && is_training() && torch::GradMode::is_enabled()) {
    pass = moe_pass_ = std::make_shared<MoePass>();
    pass->loss_gradient = moe_loss_gradient_;
  }
  // Each kind's inputs made once for the chunk, and only for a kind its blocks have.
  std::optional<BlockInputs> full, windowed;
  for (int64_t i = range.first; i < range.end; ++i) {
    auto block = std::dynamic_pointer_cast<BlockImpl>(blocks->ptr(at++));
    const bool over_window = attends_over_window(cfg_, i);
    auto& made = over_window ? windowed : full;
    if (!made) made = block_inputs(over_window ? windowed_ : full_, x, t, documents);
    const BlockInputs& in = *made;
    const int unit = static_cast<int>(i + 1);
    if (units_) units_->before_forward(unit);
    if (pass) pass->layer = i;
    if (i - range.first < recomputed) {
      x = recompute_in_backward(
          [block, in, pass](const at::Tensor& y) { return block->forward(y, in.mask, in.cos, in.sin, pass); }, x,
          blocks_draw);
    } else {
      x = block->forward(x, in.mask, in.cos, in.sin, pass);
    }
    if (units_) x = units_->after_forward(unit, x);
  }
  if (pass && pass->balance.defined())
    moe_balance_ = moe_balance_.defined() ? moe_balance_ + pass->balance : pass->balance;
  if (pass) {
    moe_routed_pairs_ += pass->routed_pairs;
    moe_dropped_pairs_ += pass->dropped_pairs;
  }
  if (pass && pass->z.defined()) moe_z_ = moe_z_.defined() ? moe_z_ + pass->z : pass->z;
  if (pass && pass->loads.defined()) moe_loads_ = moe_loads_.defined() ? moe_loads_ + pass->loads : pass->loads;
  return x;
}

torch::Tensor TransformerImpl::hidden(const torch::Tensor& tokens, const torch::Tensor& documents) {
  TORCH_CHECK(stage_.first && stage_.last && stage_.chunks.size() == 1,
              "hidden() needs the whole model, not one pipeline stage");
  return normed_output(run_blocks(embed(tokens, documents), 0, documents));
}

torch::Tensor TransformerImpl::stage_forward(const torch::Tensor& input, const torch::Tensor& targets, size_t chunk,
                                             const torch::Tensor& documents) {
  const bool embeds = stage_.first && chunk == 0, heads = stage_.last && chunk + 1 == stage_.chunks.size();
  auto x = run_blocks(embeds ? embed(input, documents) : input, chunk, documents);
  return heads ? head_loss(normed_output(x), targets) : x;
}

torch::Tensor TransformerImpl::normed_output(const torch::Tensor& x) {
  // Tied, the head's unit is unit 0, whole since the embedding.
  if (const int head = parameter_unit_layout(cfg_).head(); units_ && head != 0) units_->before_forward(head);
  return final_norm(x);
}

torch::Tensor TransformerImpl::forward(const torch::Tensor& tokens) {
  TORCH_CHECK(tp_.size() == 1 && cp_.size() == 1,
              "whole logits are not computed under tensor or context parallelism; use loss()");
  auto logits = logits_of(hidden(tokens));  // [B, T, V]
  if (units_ && !torch::GradMode::is_enabled()) units_->end_forward();
  return logits;
}

torch::Tensor TransformerImpl::logits_of(const torch::Tensor& h) const {
  auto logits = torch::linear(h, output_weight());
  if (const double cap = cfg_.final_logit_softcap; cap > 0) logits = (logits / cap).tanh() * cap;
  return logits;
}

torch::Tensor TransformerImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets,
                                    const torch::Tensor& documents) {
  return head_loss(hidden(tokens, documents), targets);
}

torch::Tensor TransformerImpl::head_loss(const torch::Tensor& h, const torch::Tensor& whole_targets) {
  const auto targets = loss_targets(whole_targets);
  torch::Tensor loss;
  if (tp_.size() > 1) {
    // This rank's vocabulary slice for every position; the softmax spans ranks.
    const auto whole = tp_.sequence_parallel ? tp_.group->gather_sequence(h) : tp_.group->copy_to(h);
    const VocabShard shard{tp_.group.get(), vocab_first_,
                           std::clamp<int64_t>(cfg_.vocab_size - vocab_first_, 0, vocab_local_)};
    loss = linear_cross_entropy(whole.reshape({-1, cfg_.dim}), output_weight(), targets.reshape({-1}), shard, 0,
                                cfg_.final_logit_softcap);
  } else {
    loss = linear_cross_entropy(h.reshape({-1, cfg_.dim}), output_weight(), targets.reshape({-1}), {}, 0,
                                cfg_.final_logit_softcap);
  }
  if (units_ && !torch::GradMode::is_enabled()) units_->end_forward();
  if (moe_pass_ && torch::GradMode::is_enabled()) loss = tap_moe_loss(loss, moe_pass_);
  moe_pass_.reset();
  return loss;
}

torch::Tensor TransformerImpl::take_moe_balance() { return std::exchange(moe_balance_, torch::Tensor()); }
torch::Tensor TransformerImpl::take_moe_z() { return std::exchange(moe_z_, torch::Tensor()); }
std::pair<int64_t, int64_t> TransformerImpl::take_moe_drops() {
  return {std::exchange(moe_routed_pairs_, 0), std::exchange(moe_dropped_pairs_, 0)};
}
torch::Tensor TransformerImpl::take_moe_loads() { return std::exchange(moe_loads_, torch::Tensor()); }

void TransformerImpl::balance_expert_biases(const torch::Tensor& loads, double rate, const torch::Tensor& skip) {
  size_t at = 0;  // the chunks' blocks in order, as forward_chunk runs them
  for (const BlockRange& range : stage_.chunks)
    for (int64_t i = range.first; i < range.end; ++i) {
      const auto block = std::dynamic_pointer_cast<BlockImpl>(blocks->ptr(at++));
      block->moe->balance_expert_bias(loads[i], rate, skip);
    }
}

}  // namespace tide
