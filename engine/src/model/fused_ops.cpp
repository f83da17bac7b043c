#include "tide/engine/model/fused_ops.h"

#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/linear_cross_entropy.h"

#include "cuda_kernel_args.h"
#include "norms.h"
#include "weight_gradient.h"

namespace tide {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// --- RMSNorm --------------------------------------------------------------------------
// y = x r w with r = 1 / sqrt(mean(x^2) + eps) per row. Backward: dw = sum_rows(g x r);
// dx = r (g w - x r^2 mean(g w x)).
struct RmsNormFn : torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, double eps) {
    auto [y, state] = rms_norm_forward(x, w, eps);
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(state.weight_dtype);
    ctx->save_for_backward({state.x, state.weight, state.rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    NormState state;
    state.x = saved[0];
    state.weight = saved[1];
    state.rstd = saved[2];
    state.weight_dtype = static_cast<c10::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    const auto d = norm_backward(grads[0], state);
    return {d.x, d.weight, at::Tensor()};
  }
};

// --- LayerNorm ------------------------------------------------------------------------
// LibTorch's native_layer_norm and its backward in fp32 (fp64 for fp64 x), keeping the
// fp32 input: autocast's policy on CUDA, and on the host too, where autocast would run
// the mixed-dtype kernel; one formula on every device, shared with normed_projections.
struct LayerNormFn : torch::autograd::Function<LayerNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                            double eps) {
    auto [y, state] = layer_norm_forward(x, w, b, eps);
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(state.weight_dtype);
    ctx->saved_data["bias_dtype"] = static_cast<int64_t>(state.bias_dtype);
    ctx->save_for_backward({state.x, state.weight, state.bias, state.mean, state.rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    NormState state{saved[0], saved[1], saved[2], saved[3], saved[4]};
    state.weight_dtype = static_cast<c10::ScalarType>(ctx->saved_data["weight_dtype"].toInt());
    state.bias_dtype = static_cast<c10::ScalarType>(ctx->saved_data["bias_dtype"].toInt());
    const auto d = norm_backward(grads[0], state);
    return {d.x, d.weight, d.bias, at::Tensor()};
  }
};

// --- Gated MLP (SwiGLU, GeGLU) ------------------------------------------------------
// p = act(g) u: d_gate = d u act'(g), d_up = d act(g).
at::Tensor activation_of(const at::Tensor& gate, GateActivation act) {
  return act == GateActivation::Silu ? at::silu(gate) : at::gelu(gate, "tanh");
}

#ifdef TIDE_LAUNCHES_KERNELS
kernels::Gate kernel_gate(GateActivation act) {
  return act == GateActivation::Silu ? kernels::Gate::Silu : kernels::Gate::GeluTanh;
}
#endif

at::Tensor glu_values(const at::Tensor& gate, const at::Tensor& up, GateActivation act) {
#ifdef TIDE_LAUNCHES_KERNELS
  if (fused_kernels_take(gate) && up.scalar_type() == gate.scalar_type()) {
    const auto g = gate.contiguous(), u = up.contiguous();
    auto out = at::empty_like(g);
    kernels::glu_forward(kernel_gate(act), g.data_ptr(), u.data_ptr(), out.data_ptr(), g.numel(), element_of(g),
                         stream_of(g));
    return out;
  }
#endif
  return activation_of(gate, act).mul_(up);
}

variable_list glu_gradients(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& d, GateActivation act) {
#ifdef TIDE_LAUNCHES_KERNELS
  if (fused_kernels_take(gate) && up.scalar_type() == gate.scalar_type()) {
    const auto g = gate.contiguous(), u = up.contiguous();
    const auto dc = d.to(g.scalar_type()).contiguous();
    auto d_gate = at::empty_like(g), d_up = at::empty_like(u);
    kernels::glu_backward(kernel_gate(act), dc.data_ptr(), g.data_ptr(), u.data_ptr(), d_gate.data_ptr(),
                          d_up.data_ptr(), nullptr, g.numel(), element_of(g), stream_of(g));
    return {d_gate, d_up};
  }
#endif
  auto d_up = activation_of(gate, act).mul_(d);
  auto d_gate = d * up;
  // in place: three tensors of the width at once, as autograd's
  if (act == GateActivation::Silu)
    at::silu_backward_out(d_gate, d_gate, gate);
  else
    at::gelu_backward_out(d_gate, d_gate, gate, "tanh");
  return {d_gate, d_up};
}

GateActivation saved_activation(AutogradContext* ctx) {
  return static_cast<GateActivation>(ctx->saved_data["activation"].toInt());
}

struct GluFn : torch::autograd::Function<GluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up, int64_t act) {
    ctx->save_for_backward({gate, up});
    ctx->saved_data["activation"] = act;
    return glu_values(gate, up, static_cast<GateActivation>(act));
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto d = glu_gradients(saved[0], saved[1], grads[0], saved_activation(ctx));
    d.emplace_back();
    return d;
  }
};

// The down projection of act(gate) * up, which it recomputes in backward (one
// elementwise pass) instead of keeping: the widest activation of a block, as
// torch.compile's partitioner also recomputes it. The weight is kept as given and
// multiplied by its working copy in the product's dtype (working_copy). The products
// are at::linear's and its backward's (matmul folded to mm, the weight's gradient as
// dy^T p): the same bits.
struct GluDownFn : torch::autograd::Function<GluDownFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up,
                            const at::Tensor& weight, int64_t act) {
    ctx->save_for_backward({gate, up, weight});
    ctx->saved_data["activation"] = act;
    return at::matmul(glu_values(gate, up, static_cast<GateActivation>(act)),
                      working_copy(weight, gate.scalar_type()).t());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &gate = saved[0], &up = saved[1], &weight = saved[2];
    const auto act = saved_activation(ctx);
    const auto dy = grads[0].reshape({-1, grads[0].size(-1)});
    const bool weight_gradient_wanted = ctx->needs_input_grad(2);  // not for a frozen weight (LoRA)
#ifdef TIDE_LAUNCHES_KERNELS
    if (weight_gradient_wanted && fused_kernels_take(gate) && up.scalar_type() == gate.scalar_type())
      return remake_in_one_pass(gate, up, weight, dy, act);
#endif
    at::Tensor d_weight;
    if (weight_gradient_wanted) {
      const auto p = glu_values(gate, up, act);
      d_weight = weight_gradient(weight, dy.t(), p.reshape({-1, p.size(-1)}));
    }  // the product is gone before the gradients of the gate and up are made
    const auto d_p = dy.mm(working_copy(weight, gate.scalar_type())).view(gate.sizes());
    auto d = glu_gradients(gate, up, d_p, act);
    d.push_back(d_weight);
    d.emplace_back();
    return d;
  }

#ifdef TIDE_LAUNCHES_KERNELS
  // On CUDA one pass over the width reads gate, up and the product's gradient and writes
  // the product again beside the gate's gradient (over the product's gradient, in place)
  // and up's: two reads of the width fewer than remaking the product on its own, and as
  // many tensors of the width alive at once.
  static variable_list remake_in_one_pass(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight,
                                          const at::Tensor& dy, GateActivation act) {
    const auto g = gate.contiguous(), u = up.contiguous();
    auto d_gate = dy.mm(working_copy(weight, g.scalar_type())).to(g.scalar_type()).contiguous();  // d_p until the pass
    auto d_up = at::empty_like(u), p = at::empty_like(g);
    kernels::glu_backward(kernel_gate(act), d_gate.data_ptr(), g.data_ptr(), u.data_ptr(), d_gate.data_ptr(),
                          d_up.data_ptr(), p.data_ptr(), g.numel(), element_of(g), stream_of(g));
    auto d_weight = weight_gradient(weight, dy.t(), p.view({-1, p.size(-1)}));
    return {d_gate.view(gate.sizes()), d_up, d_weight, at::Tensor()};
  }
#endif
};

// --- Projection -----------------------------------------------------------------------
// x W^T + b computed in `dtype` as autocast's at::linear computes it, keeping x (cast) and
// the fp32 weight, whose working copy backward asks for again (the step's, where a
// WeightCastScope keeps them; else a fresh cast, so that none lives from the layer's
// forward to its backward). The products are at::linear's and its backward's. Two
// nodes, with and without the bias: a node's inputs must all be defined tensors.
at::Tensor projection_forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& bias, int64_t dtype_code) {
  const auto dtype = static_cast<at::ScalarType>(dtype_code);
  const auto xc = x.to(dtype);
  ctx->save_for_backward({xc, weight});
  ctx->saved_data["dtype"] = dtype_code;
  ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
  ctx->saved_data["bias_dtype"] = bias.defined() ? static_cast<int64_t>(bias.scalar_type()) : int64_t{-1};
  return at::linear(xc, working_copy(weight, dtype), bias.defined() ? bias.to(dtype) : at::Tensor());
}

// The gradients of x, the weight and (where there is one) the bias.
variable_list projection_backward(AutogradContext* ctx, const at::Tensor& grad) {
  const auto saved = ctx->get_saved_variables();
  const auto &x = saved[0], &weight = saved[1];
  const auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
  const auto dy = grad.reshape({-1, grad.size(-1)});
  at::Tensor dx, dw;
  if (ctx->needs_input_grad(0))
    dx = dy.mm(working_copy(weight, dtype))
             .view(x.sizes())
             .to(static_cast<at::ScalarType>(ctx->saved_data["x_dtype"].toInt()));
  if (ctx->needs_input_grad(1)) dw = weight_gradient(weight, dy.t(), x.reshape({-1, x.size(-1)}));
  const int64_t bias_dtype = ctx->saved_data["bias_dtype"].toInt();
  if (bias_dtype < 0) return {dx, dw};
  at::Tensor db;
  if (ctx->needs_input_grad(2)) db = dy.sum(0).to(static_cast<at::ScalarType>(bias_dtype));
  return {dx, dw, db};
}

struct ProjectionFn : torch::autograd::Function<ProjectionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, int64_t dtype) {
    return projection_forward(ctx, x, weight, at::Tensor(), dtype);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto d = projection_backward(ctx, grads[0]);
    d.emplace_back();  // dtype
    return d;
  }
};

struct BiasedProjectionFn : torch::autograd::Function<BiasedProjectionFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                            int64_t dtype) {
    return projection_forward(ctx, x, weight, bias, dtype);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto d = projection_backward(ctx, grads[0]);
    d.emplace_back();  // dtype
    return d;
  }
};

// --- Rotary ---------------------------------------------------------------------------
// rotate_half(x) = (-x2, x1) is a rotation by a quarter turn in each pair, whose
// transpose is its negative: dx = dy cos - rotate_half(dy sin).
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

#ifdef TIDE_LAUNCHES_KERNELS
at::Tensor rotary_kernel(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
  const auto x = x_in.stride(-1) == 1 ? x_in : x_in.contiguous();
  const auto c = cos.to(x.scalar_type()).contiguous(), s = sin.to(x.scalar_type()).contiguous();
  auto y = at::empty_like(x);  // x's layout ([B, T, H, Hd] memory under a [B, H, T, Hd] view)
  kernels::RopeShape shape{x.size(0),
                           x.size(1),
                           x.size(2),
                           x.size(3),
                           {x.stride(0), x.stride(1), x.stride(2)},
                           {y.stride(0), y.stride(1), y.stride(2)}};
  kernels::rope(x.data_ptr(), c.data_ptr(), s.data_ptr(), y.data_ptr(), shape, inverse, element_of(x), stream_of(x));
  return y;
}
#endif

struct RotaryFn : torch::autograd::Function<RotaryFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
#ifdef TIDE_LAUNCHES_KERNELS
    if (fused_kernels_take(x) && x.dim() == 4) return rotary_kernel(x, cos, sin, /*inverse=*/false);
#endif
    return x * cos + rotate_half(x) * sin;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &cos = saved[0], &sin = saved[1];
    const auto& dy = grads[0];
#ifdef TIDE_LAUNCHES_KERNELS
    if (fused_kernels_take(dy) && dy.dim() == 4) return {rotary_kernel(dy, cos, sin, /*inverse=*/true), {}, {}};
#endif
    return {dy * cos - rotate_half(dy * sin), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool fused_kernels_take(const at::Tensor& x) {
#ifdef TIDE_LAUNCHES_KERNELS
  const auto t = x.scalar_type();
  return on_kernel_device(x) && (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf);
#else
  (void)x;
  return false;
#endif
}

// Each node's forward is an operator in a profile (its backward is named by autograd):
// the kernels it launches are its own there, not the step's.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  RECORD_FUNCTION("tide::rms_norm", std::vector<c10::IValue>({x, weight}));
  return RmsNormFn::apply(x, weight, eps);
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, double eps) {
  TORCH_CHECK(bias.defined(), "layer_norm: a bias is required (zeros for none)");
  RECORD_FUNCTION("tide::layer_norm", std::vector<c10::IValue>({x, weight, bias}));
  return LayerNormFn::apply(x, weight, bias, eps);
}

at::Tensor glu(const at::Tensor& gate, const at::Tensor& up, GateActivation act) {
  RECORD_FUNCTION("tide::glu", std::vector<c10::IValue>({gate, up}));
  return GluFn::apply(gate, up, static_cast<int64_t>(act));
}

at::Tensor projection(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const auto dtype = compute_dtype_for(weight);
  if (dtype == weight.scalar_type()) return at::linear(x, weight, bias);
  RECORD_FUNCTION("tide::projection", std::vector<c10::IValue>({x, weight}));
  if (bias.defined()) return BiasedProjectionFn::apply(x, weight, bias, static_cast<int64_t>(dtype));
  return ProjectionFn::apply(x, weight, static_cast<int64_t>(dtype));
}

at::Tensor glu_down(const at::Tensor& gate, const at::Tensor& up, const at::Tensor& weight, GateActivation act) {
  TORCH_CHECK(gate.sizes() == up.sizes() && weight.dim() == 2 && weight.size(1) == gate.size(-1), "glu_down: gate ",
              gate.sizes(), " and up ", up.sizes(), " must agree and weight ", weight.sizes(), " must be [out, ",
              gate.size(-1), "]");
  RECORD_FUNCTION("tide::glu_down", std::vector<c10::IValue>({gate, up, weight}));
  return GluDownFn::apply(gate, up, weight, static_cast<int64_t>(act));
}

at::Tensor rotary(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  RECORD_FUNCTION("tide::rotary", std::vector<c10::IValue>({x, cos, sin}));
  return RotaryFn::apply(x, cos, sin);
}

at::Tensor cross_entropy_rows_(at::Tensor& logits, const at::Tensor& targets, bool gradient) {
  TORCH_CHECK(fused_kernels_take(logits) && logits.dim() == 2 && logits.is_contiguous(),
              "cross_entropy_rows_: contiguous CUDA logits [rows, V] in fp32, bf16 or fp16 expected");
#ifdef TIDE_LAUNCHES_KERNELS
  static_assert(kernels::kUncountedTarget == kUncountedTarget, "the kernel and the loss agree on uncounted targets");
  const auto t = targets.to(at::kLong).contiguous();
  auto loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
  kernels::cross_entropy_rows(logits.data_ptr(), t.const_data_ptr<int64_t>(), loss.data_ptr<float>(), logits.size(0),
                              logits.size(1), gradient, element_of(logits), stream_of(logits));
  return loss;
#else
  (void)targets;
  (void)gradient;
  return {};
#endif
}

}  // namespace tide
