// Norm, attention, MLP and block of the decoder. See transformer.h for the shape legend.
#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <ATen/ops/scaled_dot_product_attention.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/functional/dropout.h>
#include <torch/nn/functional/normalization.h>
#include <torch/types.h>

#include "tide/engine/model/chunk_attention.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/context_parallel.h"
#include "tide/engine/model/fused_ops.h"
#include "tide/engine/model/softcapped_attention.h"
#include "tide/engine/model/transformer.h"

#include "model/tensor_storage.h"

namespace tide {
namespace F = torch::nn::functional;

NormImpl::NormImpl(NormKind kind, int64_t dim, double eps, bool zero_centered,
                   std::shared_ptr<TensorParallelGroup> sequence_parallel)
    : kind_(kind), eps_(eps), zero_centered_(zero_centered), sequence_parallel_(std::move(sequence_parallel)) {
  weight = register_parameter("weight", parameter_tensor({dim}));
  if (kind == NormKind::LayerNorm) bias = register_parameter("bias", parameter_tensor({dim}));
  if (!DeferredStorage::active()) reset_parameters();
}

void NormImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  weight.fill_(zero_centered_ ? 0.0 : 1.0);
  if (bias.defined()) bias.zero_();
}

NormWeights NormImpl::step_weights() const {
  const bool ln = kind_ == NormKind::LayerNorm;
  NormWeights w{weight, bias, eps_, ln};
  if (sequence_parallel_) {
    w.weight = sequence_parallel_->copy_to(weight);
    if (ln) w.bias = sequence_parallel_->copy_to(bias);
  }
  if (zero_centered_) w.weight = w.weight + 1;
  return w;
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) {
  const auto n = step_weights();
  return n.layer_norm ? layer_norm(x, n.weight, n.bias, n.eps) : rms_norm(x, n.weight, n.eps);
}

ProjectionImpl::ProjectionImpl(int64_t in, int64_t out, bool with_bias, LoraShape lora) {
  weight = register_parameter("weight", parameter_tensor({out, in}));
  if (with_bias) bias = register_parameter("bias", parameter_tensor({out}));
  if (lora.rank > 0) {
    // Submodules holding one weight each, so that the names are PEFT's
    // (`q_proj.lora_A.weight`).
    lora_a = register_module("lora_A", std::make_shared<torch::nn::Module>())
                 ->register_parameter("weight", parameter_tensor({lora.rank, in}));
    lora_b = register_module("lora_B", std::make_shared<torch::nn::Module>())
                 ->register_parameter("weight", parameter_tensor({out, lora.rank}));
    lora_scale = lora.alpha / static_cast<double>(lora.rank);
    lora_dropout = lora.dropout;
  }
}

torch::Tensor ProjectionImpl::forward(const torch::Tensor& x) const {
  const auto y = projection(x, weight, bias);
  return adapted() ? y + lora_update_of_input(x) : y;
}

// The scale is applied to the rank-wide product, the narrowest tensor of the update.
torch::Tensor ProjectionImpl::lora_update(const torch::Tensor& a, const torch::Tensor& b) const {
  return projection(a * lora_scale, b.defined() ? b : lora_b, {});
}

torch::Tensor ProjectionImpl::lora_update_of_input(const torch::Tensor& x) const {
  return lora_update(projection(adapter_input(x), lora_a, {}));
}

torch::Tensor ProjectionImpl::adapter_input(const torch::Tensor& x, int64_t part, int64_t parts) const {
  if (!drops_adapter_input()) return x;
  // The mask scaled, as at::dropout makes it, drawn for the whole input in one layout.
  auto whole = x.sizes().vec();
  const int64_t width = whole.back();
  whole.back() = width * parts;
  const auto kept = at::dropout(at::ones(whole, x.options()), lora_dropout, /*train=*/true);
  return x * (parts == 1 ? kept : kept.narrow(-1, part * width, width));
}

namespace {

// Into a column-parallel layer: the whole sequence on every rank.
torch::Tensor enter_tp(const torch::Tensor& x, const TensorParallel& tp) {
  if (!tp.group) return x;
  return tp.sequence_parallel ? tp.group->gather_sequence(x) : tp.group->copy_to(x);
}

// A layer's projected input, and (LayerInput::onto_residual) the residual stream its
// output is added onto.
struct ProjectedInput {
  std::vector<torch::Tensor> out;
  torch::Tensor residual;
};

// The input's projections by each of `ps` (column-parallel under tensor parallelism). A
// normed input goes through one normed_projections node, which keeps the residual stream
// rather than the norm's output, and with sequence parallelism gathers the sequence
// again in backward rather than keeping it gathered; the residual stream the layer adds
// onto is that node's output too, so that its gradient joins the norm's in one pass.
ProjectedInput project_all(const LayerInput& in, const std::vector<ProjectionWeights>& ps, const TensorParallel& tp) {
  if (!in.norm) {
    const auto x = enter_tp(in.x, tp);
    ProjectedInput p;
    for (const auto& w : ps) p.out.push_back(projection(x, w.weight, w.bias));
    if (in.onto_residual) p.residual = in.x;
    return p;
  }
  ProjectionExchange exchange;
  if (tp.group && tp.sequence_parallel) {
    exchange.to_projections = [group = tp.group](const at::Tensor& y) {
      return group->sequence_all_gather(y, "sequence all-gather");
    };
    exchange.from_projections = [group = tp.group](const at::Tensor& g) {
      return group->sequence_reduce_scatter(g, "sequence reduce-scatter (backward)");
    };
  } else if (tp.group) {
    exchange.from_projections = [group = tp.group](const at::Tensor& g) {  // Megatron's f (copy_to)
      auto sum = g.contiguous();                                           // the node's own gradient: summed in place
      group->all_reduce_sum(sum, "tensor-parallel input gradient");
      return sum;
    };
  }
  ProjectedInput p;
  p.out = normed_projections(in.x, in.norm->step_weights(), ps, std::move(exchange), in.onto_residual);
  if (in.onto_residual) {
    p.residual = p.out.back();
    p.out.pop_back();
  }
  return p;
}

// The LoRA matrices a column-parallel layer's step reads: its B is split with its rows,
// its A held whole on every rank, where each rank's product uses it for that rank's rows
// alone, so copy_to sums A's gradient over the ranks (and the input gradient through A,
// like the weights', is summed by the layer's exchange).
struct LoraWeights {
  torch::Tensor a, b;
};

// A parameter every rank holds whole and uses for its own part of a product: read
// through copy_to, whose backward sums its gradient over the ranks.
torch::Tensor whole_on_every_rank(const torch::Tensor& t, const TensorParallel& tp) {
  return tp.group ? tp.group->copy_to(t) : t;
}

// What each of `layers` (column-parallel) reads for its adapter; none where it has none.
std::vector<LoraWeights> column_lora(const std::vector<const ProjectionImpl*>& layers, const TensorParallel& tp) {
  std::vector<LoraWeights> out;
  for (const auto* l : layers)
    out.push_back(l->adapted() ? LoraWeights{whole_on_every_rank(l->lora_a, tp), l->lora_b} : LoraWeights{});
  return out;
}

// project_all, where `layers` (one for each of `ps`) are the projections whose weights
// they are and `adapters` (one for each; column_lora) what their adapters read: those
// with an adapter have their A projections computed in the same pass (normed: in the
// same node, which sums their input gradients with the others') and their updates added
// to their outputs.
ProjectedInput project_input(const LayerInput& in, const std::vector<ProjectionWeights>& ps, const TensorParallel& tp,
                             const std::vector<const ProjectionImpl*>& layers,
                             const std::vector<LoraWeights>& adapters) {
  const bool drops = std::any_of(layers.begin(), layers.end(), [](const auto* l) { return l->drops_adapter_input(); });
  if (drops) {
    // Under lora_dropout each adapter reads its own dropped copy of the layer's input (as
    // PEFT's adapters, each with its dropout, do), so A's products leave the shared pass:
    // the input (normed here) made once for them, and kept by each for its gradient.
    ProjectedInput p = project_all(in, ps, tp);
    const auto x = enter_tp(in.norm ? in.norm->forward(in.x) : in.x, tp);
    for (size_t i = 0; i < layers.size(); ++i)
      if (layers[i]->adapted())
        p.out[i] = p.out[i] +
                   layers[i]->lora_update(projection(layers[i]->adapter_input(x), adapters[i].a, {}), adapters[i].b);
    return p;
  }
  std::vector<ProjectionWeights> all = ps;
  std::vector<size_t> lora_at(ps.size(), 0);  // where its A projection is in `all` (0: none)
  for (size_t i = 0; i < layers.size(); ++i) {
    if (!layers[i]->adapted()) continue;
    lora_at[i] = all.size();
    all.push_back({adapters[i].a, {}});
  }
  ProjectedInput p = project_all(in, all, tp);
  for (size_t i = 0; i < layers.size(); ++i)
    if (lora_at[i]) p.out[i] = p.out[i] + layers[i]->lora_update(p.out[lora_at[i]], adapters[i].b);
  p.out.resize(ps.size());
  return p;
}

ProjectedInput project_input(const LayerInput& in, const std::vector<ProjectionWeights>& ps, const TensorParallel& tp,
                             const std::vector<const ProjectionImpl*>& layers) {
  return project_input(in, ps, tp, layers, column_lora(layers, tp));
}

// y added onto the residual stream, where there is one.
torch::Tensor onto(const torch::Tensor& residual, const torch::Tensor& y) {
  return residual.defined() ? residual + y : y;
}

// A projection's parameters, for projection and normed_projections (fused_ops.h), which
// take the weight's working copy (once per step under a WeightCastScope).
ProjectionWeights weights_of(const Projection& l) { return {l->weight, l->bias}; }

// Out of a row-parallel layer, whose product on this rank is y: the partial sums added
// over ranks (and with sequence parallelism each rank keeps its part of the sequence),
// then the bias, once.
torch::Tensor reduce_row_parallel(const torch::Tensor& y, const torch::Tensor& bias, const TensorParallel& tp) {
  const auto out = !tp.group              ? y
                   : tp.sequence_parallel ? tp.group->reduce_scatter_sequence(y)
                                          : tp.group->reduce_from(y);
  if (!bias.defined()) return out;
  // In the product's dtype, as at::linear adds it: a bf16 residual stream stays bf16.
  const auto b = tp.sequence_parallel ? tp.group->copy_to(bias) : bias;
  return out + b.to(out.scalar_type());
}

// This rank's part of a row-parallel layer's product, its bias not added. An adapter's
// update is linear in A's product, which is a sum over the ranks' input columns as the
// weight's is: each rank adds scale (x_r A_r^T) B^T to its part before the parts are
// summed, B held whole on every rank and its gradient summed over them by copy_to.
torch::Tensor row_parallel_part(const torch::Tensor& x, const ProjectionImpl& layer, const TensorParallel& tp) {
  const auto y = projection(x, layer.weight, {});
  if (!layer.adapted()) return y;
  return y + layer.lora_update(projection(layer.adapter_input(x, tp.rank(), tp.size()), layer.lora_a, {}),
                               whole_on_every_rank(layer.lora_b, tp));
}

// A row-parallel layer, added onto the residual stream where one is given.
torch::Tensor leave_tp(const torch::Tensor& x, const ProjectionImpl& layer, const TensorParallel& tp,
                       const torch::Tensor& residual = {}) {
  if (!tp.group) return onto(residual, layer.forward(x));
  return onto(residual, reduce_row_parallel(row_parallel_part(x, layer, tp), layer.bias, tp));
}

// The adapter of the block projection named so (model.lora_targets), or none.
LoraShape lora_of(const ModelConfig& cfg, const std::string& name) {
  const auto targets = lora_target_names(cfg);
  if (std::find(targets.begin(), targets.end(), name) == targets.end()) return {};
  return {cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout};
}
}  // namespace

AttentionImpl::AttentionImpl(const ModelConfig& cfg, const TensorParallel& tp) : cfg_(cfg), tp_(tp) {
  const int64_t d = cfg.dim, hd = head_dim(cfg), kv = resolved_kv_heads(cfg);
  heads_ = cfg.n_heads / tp.size();
  if (kv % tp.size() == 0) {
    kv_heads_ = kv / tp.size();
  } else {  // fewer key/value heads than ranks: held whole, one head used here
    kv_heads_ = 1;
    kv_first_ = tp.rank() * heads_ / (cfg.n_heads / kv);
  }
  const int64_t local = heads_ * hd;
  if (cfg.family == Family::BLOOM) {
    qkv = register_module("query_key_value",
                          Projection(d, 3 * local, cfg.attention_bias, lora_of(cfg, "query_key_value")));
    out = register_module("dense", Projection(local, d, cfg.attention_bias, lora_of(cfg, "dense")));
  } else {
    const int64_t kv_rows = (kv_first_ >= 0 ? kv : kv_heads_) * hd;
    const bool qkv_bias = cfg.attention_bias || cfg.qkv_bias;
    q_proj = register_module("q_proj", Projection(d, local, qkv_bias, lora_of(cfg, "q_proj")));
    k_proj = register_module("k_proj", Projection(d, kv_rows, qkv_bias, lora_of(cfg, "k_proj")));
    v_proj = register_module("v_proj", Projection(d, kv_rows, qkv_bias, lora_of(cfg, "v_proj")));
    out = register_module("o_proj", Projection(local, d, cfg.attention_bias, lora_of(cfg, "o_proj")));
    if (cfg.qk_norm) {
      const auto group = tp.size() > 1 ? tp.group : nullptr;  // each rank's heads add to the gradient
      q_norm = register_module("q_norm", Norm(NormKind::RMSNorm, hd, cfg.norm_eps, cfg.norm_zero_centered, group));
      k_norm = register_module("k_norm", Norm(NormKind::RMSNorm, hd, cfg.norm_eps, cfg.norm_zero_centered, group));
    }
  }
}

torch::Tensor AttentionImpl::forward(const LayerInput& x, const AttentionMask& mask, const torch::Tensor& cos,
                                     const torch::Tensor& sin) {
  const int64_t h = heads_, hd = head_dim(cfg_);
  const int64_t k_heads = kv_heads_;
  torch::Tensor q, k, v, residual;
  if (qkv) {
    // BLOOM's fused layout: output features are ordered [H, 3, Hd].
    auto in = project_input(x, {weights_of(qkv)}, tp_, {qkv.get()});
    residual = in.residual;
    const auto projected = in.out[0];
    const auto fused = projected.view({projected.size(0), projected.size(1), h, 3, hd});
    q = fused.select(3, 0).transpose(1, 2);  // [B, H, T, Hd]
    k = fused.select(3, 1).transpose(1, 2);
    v = fused.select(3, 2).transpose(1, 2);
  } else {
    std::vector<ProjectionWeights> ps{weights_of(q_proj), weights_of(k_proj), weights_of(v_proj)};
    const std::vector<const ProjectionImpl*> layers{q_proj.get(), k_proj.get(), v_proj.get()};
    auto adapters = column_lora(layers, tp_);
    if (kv_first_ >= 0) {
      // Every rank holds the key/value projections whole and uses one head's rows; the
      // gradients of the rows are summed over the ranks that used them (LoRA's B's rows
      // as the weight's).
      const auto rows = [&](const torch::Tensor& t) { return tp_.group->copy_to(t).narrow(0, kv_first_ * hd, hd); };
      for (size_t i = 1; i < 3; ++i) {
        ps[i].weight = rows(ps[i].weight);
        if (ps[i].bias.defined()) ps[i].bias = rows(ps[i].bias);
        if (adapters[i].b.defined()) adapters[i].b = rows(adapters[i].b);
      }
    }
    auto in = project_input(x, ps, tp_, layers, adapters);
    residual = in.residual;
    const auto& projected = in.out;
    const int64_t b = projected[0].size(0), t = projected[0].size(1);
    q = projected[0].view({b, t, h, hd});
    k = projected[1].view({b, t, k_heads, hd});
    if (q_norm) {  // over each head's width, before RoPE
      q = q_norm(q);
      k = k_norm(k);
    }
    q = q.transpose(1, 2);  // [B, H, T, Hd]
    k = k.transpose(1, 2);  // [B, K, T, Hd]
    v = projected[2].view({b, t, k_heads, hd}).transpose(1, 2);
  }
  if (cos.defined()) {
    q = rotary(q, cos, sin);
    k = rotary(k, cos, sin);
  }
  const int64_t batch = q.size(0), tokens = q.size(2);
  if (mask.by_heads) {  // the whole sequence for this rank's share of the heads (context_parallel.h)
    auto whole = sequence_of_heads(q, k, v, *mask.by_heads);
    q = std::move(whole.q);
    k = std::move(whole.k);
    v = std::move(whole.v);
  }
  // One kernel for scores, softmax and the weighted sum: flash / memory-efficient / cuDNN
  // on CUDA, the blocked flash kernel on the host (the math fallback where neither takes
  // the inputs). Grouped-query attention reads each key/value head for its H / K query
  // heads without repeating it; causal-only attention passes no mask, so a backend that
  // skips the masked blocks can. A dense mask is additive (ALiBi, documents apart; one
  // tensor for all of a chunk's blocks of a kind) or boolean; a window shorter than the
  // sequence is attended in parts (attention_masks.h), one such call each.
  // Soft-capped scores (Gemma 2) take a path of their own (softcapped_attention.h): no
  // such kernel takes a cap. A context-parallel chunk after other keys, causal and
  // unmasked, is two fused calls (chunk_attention.h); under attention dropout, which
  // those cannot draw again in backward, one call with a boolean mask.
  const double dropout = cfg_.dropout > 0 && is_training() ? cfg_.dropout : 0.0;
  const auto scale = cfg_.softmax_scale > 0 ? cfg_.softmax_scale : 1.0 / std::sqrt(static_cast<double>(hd));
  const double cap = cfg_.attention_softcap;
  const bool gqa = k.size(1) != q.size(1);
  const PartAttention attend = [&](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& bias) {
    if (cap > 0) return softcapped_attention(q, k, v, bias, scale, cap, dropout);
    std::optional<at::Tensor> m;
    if (bias.defined()) {
      m = bias.scalar_type() == at::kBool ? bias : bias.to(q.scalar_type());  // same dtype: no copy
    } else if (k.size(2) > q.size(2)) {
      if (dropout == 0 && chunk_attention_supported(q)) return chunk_attention(q, k, v, scale);
      m = allowed_keys(q.size(2), k.size(2), 0, q.device());
    }
    return at::scaled_dot_product_attention(q, k, v, m, dropout, /*is_causal=*/!m, scale, gqa);
  };
  // Context-parallel chunks all attended as chunk_attention does: one node that gathers
  // the keys again in backward (context_parallel.h).
  const bool unmasked_chunks =
      mask.context && mask.context->unmasked() && cap == 0 && dropout == 0 && chunk_attention_supported(q);
  // [B, H, T, Hd]
  torch::Tensor ctx = unmasked_chunks ? unmasked_context_attention(q, k, v, *mask.context, scale)
                      : mask.context  ? context_attention(q, k, v, *mask.context, attend)
                      : mask.windowed ? windowed_attention(q, k, v, *mask.windowed, attend)
                                      : attend(q, k, v, mask.bias);
  if (mask.by_heads) ctx = tokens_of_heads(ctx, *mask.by_heads);
  ctx = ctx.transpose(1, 2).reshape({batch, tokens, h * hd});
  return leave_tp(ctx, *out, tp_, residual);  // [B, T, D]
}

MlpImpl::MlpImpl(const ModelConfig& cfg, const TensorParallel& tp) : kind_(cfg.mlp), tp_(tp) {
  const int64_t d = cfg.dim, f = resolved_ffn_dim(cfg) / tp.size();
  const bool bloom_names = cfg.family == Family::BLOOM && cfg.mlp == MlpKind::GELU;
  const std::string up_name = bloom_names ? "dense_h_to_4h" : "up_proj";
  const std::string down_name = bloom_names ? "dense_4h_to_h" : "down_proj";
  if (gated_mlp(cfg)) gate = register_module("gate_proj", Projection(d, f, cfg.mlp_bias, lora_of(cfg, "gate_proj")));
  up = register_module(up_name, Projection(d, f, cfg.mlp_bias, lora_of(cfg, up_name)));
  down = register_module(down_name, Projection(f, d, cfg.mlp_bias, lora_of(cfg, down_name)));
}

torch::Tensor MlpImpl::forward(const LayerInput& x) {
  if (gate) {
    // The down projection recomputes act(gate) * up in backward: the widest tensor of a
    // block is not kept.
    const auto act = kind_ == MlpKind::GeGLU ? GateActivation::GeluTanh : GateActivation::Silu;
    const auto in = project_input(x, {weights_of(gate), weights_of(up)}, tp_, {gate.get(), up.get()});
    // An adapted down projection's A reads the product, which is then kept for backward.
    const auto y = down->adapted() ? row_parallel_part(glu(in.out[0], in.out[1], act), *down, tp_)
                                   : glu_down(in.out[0], in.out[1], down->weight, act);
    return onto(in.residual, reduce_row_parallel(y, down->bias, tp_));
  }
  const auto in = project_input(x, {weights_of(up)}, tp_, {up.get()});
  return leave_tp(torch::gelu(in.out[0], "tanh"), *down, tp_, in.residual);
}

torch::Tensor MlpImpl::forward_part(const torch::Tensor& x) {
  const TensorParallel entered;  // the caller's input is summed over the ranks in backward
  if (gate) {
    const auto act = kind_ == MlpKind::GeGLU ? GateActivation::GeluTanh : GateActivation::Silu;
    const auto in = project_input(x, {weights_of(gate), weights_of(up)}, entered, {gate.get(), up.get()});
    return glu_down(in.out[0], in.out[1], down->weight, act);
  }
  const auto in = project_input(x, {weights_of(up)}, entered, {up.get()});
  return projection(torch::gelu(in.out[0], "tanh"), down->weight, {});
}

BlockImpl::BlockImpl(const ModelConfig& cfg, const TensorParallel& tp, const ExpertParallel& ep)
    : dropout_(cfg.dropout) {
  const auto sp = tp.sequence_parallel ? tp.group : nullptr;
  const auto norm = [&] { return Norm(cfg.norm, cfg.dim, cfg.norm_eps, cfg.norm_zero_centered, sp); };
  // Registered in the order a forward uses them. With post-norms Hugging Face's Gemma 2
  // and 3 name the norm after attention post_attention_layernorm, the one LLaMA puts
  // before the MLP.
  input_norm = register_module("input_layernorm", norm());
  attention = register_module(cfg.family == Family::BLOOM ? "self_attention" : "self_attn", Attention(cfg, tp));
  if (cfg.post_norms) {
    attention_out_norm = register_module("post_attention_layernorm", norm());
    mlp_norm = register_module("pre_feedforward_layernorm", norm());
  } else {
    mlp_norm = register_module("post_attention_layernorm", norm());
  }
  if (cfg.moe_experts > 0)
    moe = register_module("mlp", Moe(cfg, tp, ep));
  else
    mlp = register_module("mlp", Mlp(cfg, tp));
  if (cfg.post_norms) mlp_out_norm = register_module("post_feedforward_layernorm", norm());
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x, const AttentionMask& mask, const torch::Tensor& cos,
                                 const torch::Tensor& sin, const std::shared_ptr<MoePass>& moe_pass) {
  const bool dropout = dropout_ > 0 && is_training();
  if (!dropout && !attention_out_norm) {  // each layer adds its output onto the stream itself
    const auto h = attention(LayerInput(x, *input_norm, /*onto_residual=*/true), mask, cos, sin);
    if (moe) return h + moe->forward(mlp_norm(h), moe_pass);
    return mlp(LayerInput(h, *mlp_norm, /*onto_residual=*/true));
  }
  // A post-norm, then dropout, fall between a layer's output and the stream.
  const auto branch = [&](torch::Tensor y, Norm& out_norm) {
    if (out_norm) y = out_norm(y);
    return dropout ? F::dropout(y, F::DropoutFuncOptions().p(dropout_)) : y;
  };
  const auto h = x + branch(attention(LayerInput(x, *input_norm), mask, cos, sin), attention_out_norm);
  return h + branch(moe ? moe->forward(mlp_norm(h), moe_pass) : mlp(LayerInput(h, *mlp_norm)), mlp_out_norm);
}

}  // namespace tide
