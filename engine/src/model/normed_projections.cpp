// normed_projections (fused_ops.h): a norm and the projections that read its output as one
// autograd node that keeps the norm's input, not its output.
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

#include "norms.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/fused_ops.h"
#include "weight_gradient.h"

namespace tide {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The node's inputs are one list: x, the norm's weight and bias (where it has one), then
// each projection's weight and bias (where it has one). A node's inputs must be defined
// tensors, so the layout says which are there.
struct Layout : torch::CustomClassHolder {
  double eps = 1e-5;
  bool layer_norm = false, norm_bias = false;
  std::vector<std::pair<size_t, size_t>> slots;  // each projection's weight and bias (0: none)
  at::ScalarType dtype = at::kFloat;             // the projections compute in
  ProjectionExchange exchange;
  bool residual_out = false;  // x is also an output, after the projections
};

std::pair<at::Tensor, NormState> apply_norm(at::TensorList in, const Layout& l) {
  if (l.layer_norm) return layer_norm_forward(in[0], in[1], l.norm_bias ? in[2] : at::Tensor(), l.eps);
  return rms_norm_forward(in[0], in[1], l.eps);
}

struct NormedProjectionsFn : torch::autograd::Function<NormedProjectionsFn> {
  static variable_list forward(AutogradContext* ctx, at::TensorList in, const c10::intrusive_ptr<Layout>& layout) {
    ctx->saved_data["layout"] = c10::IValue::make_capsule(layout);
    ctx->save_for_backward(in.vec());  // x and parameters: nothing made here
    auto y = apply_norm(in, *layout).first;
    if (layout->exchange.to_projections) y = layout->exchange.to_projections(y);
    y = y.to(layout->dtype);
    variable_list out;
    for (const auto& [w_at, b_at] : layout->slots) {
      const auto bias = b_at ? in[b_at].to(layout->dtype) : at::Tensor();
      out.push_back(at::linear(y, working_copy(in[w_at], layout->dtype), bias));  // projection's product
    }
    // An input returned as it is: autograd makes it a view of x whose gradient comes here.
    if (layout->residual_out) out.push_back(in[0]);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto layout = c10::static_intrusive_pointer_cast<Layout>(ctx->saved_data["layout"].toCapsule());
    const auto in = ctx->get_saved_variables();
    variable_list d(in.size() + 1);  // and none for the layout
    auto [y_norm, state] = apply_norm(in, *layout);
    const auto y_dtype = y_norm.scalar_type();
    const at::Tensor d_residual = layout->residual_out ? grads[layout->slots.size()] : at::Tensor();
    at::Tensor dy;  // the gradient of the norm's output: the projections' summed, [rows, dim]
    std::vector<int64_t> y_sizes;
    {
      auto y = layout->exchange.to_projections ? layout->exchange.to_projections(y_norm) : y_norm;
      y_norm = at::Tensor();
      y = y.to(layout->dtype);
      const auto y_rows = y.reshape({-1, y.size(-1)});
      y_sizes = y.sizes().vec();
      // Each projection's input gradient is summed by the GEMM into the others' (the
      // product added to C as it is written, rounded once), not by a separate pass
      // over the rows for each projection: where the norm's output is in the compute
      // dtype, as under bf16 compute with a bf16 residual stream. A norm output of
      // another dtype (fp32 stream, bf16 products) is summed in its own dtype.
      const bool in_gemm = y_dtype == layout->dtype;
      for (size_t k = layout->slots.size(); k-- > 0;) {
        if (!grads[k].defined()) continue;
        const auto [w_at, b_at] = layout->slots[k];
        const auto& weight = in[w_at];
        // projection_backward's products (at::linear's backward).
        const auto g = grads[k].reshape({-1, grads[k].size(-1)});
        const auto w = working_copy(weight, layout->dtype);
        if (!dy.defined())
          dy = g.mm(w).to(y_dtype);
        else if (in_gemm)
          dy.addmm_(g, w);
        else
          dy.add_(g.mm(w).to(y_dtype));
        // A frozen weight (LoRA's base) gets none: the product is the larger part of its
        // projection's backward.
        if (ctx->needs_input_grad(w_at)) d[w_at] = weight_gradient(weight, g.t(), y_rows);
        if (b_at && ctx->needs_input_grad(b_at)) d[b_at] = g.sum(0).to(in[b_at].scalar_type());
      }
    }  // the remade output is gone before the norm's backward
    if (!dy.defined()) {
      d[0] = d_residual;
      return d;
    }
    dy = dy.view(y_sizes);
    if (layout->exchange.from_projections) dy = layout->exchange.from_projections(dy);
    const auto n = norm_backward(dy, state, d_residual);
    d[0] = n.x;
    d[1] = n.weight;
    if (layout->norm_bias) d[2] = n.bias;
    return d;
  }
};

}  // namespace

std::vector<at::Tensor> normed_projections(const at::Tensor& x, const NormWeights& norm,
                                           const std::vector<ProjectionWeights>& projections,
                                           ProjectionExchange exchange, bool residual_out) {
  const int64_t dim = x.size(-1);
  TORCH_CHECK(!projections.empty(), "normed_projections: no projection given");
  TORCH_CHECK(norm.weight.dim() == 1 && norm.weight.size(0) == dim, "normed_projections: norm weight ",
              norm.weight.sizes(), " must be [", dim, "], the last dimension of x ", x.sizes());
  TORCH_CHECK(norm.bias.defined() == norm.layer_norm, "normed_projections: a LayerNorm has a bias, an RMSNorm none");
  auto layout = c10::make_intrusive<Layout>();
  layout->eps = norm.eps;
  layout->layer_norm = norm.layer_norm;
  layout->norm_bias = norm.bias.defined();
  layout->dtype = compute_dtype_for(projections.front().weight);
  layout->exchange = std::move(exchange);
  layout->residual_out = residual_out;
  std::vector<at::Tensor> in{x, norm.weight};
  if (norm.bias.defined()) in.push_back(norm.bias);
  for (const auto& p : projections) {
    TORCH_CHECK(p.weight.dim() == 2 && p.weight.size(1) == dim, "normed_projections: projection weight ",
                p.weight.sizes(), " must be [out, ", dim, "]");
    TORCH_CHECK(compute_dtype_for(p.weight) == layout->dtype, "normed_projections: the projections' weights ",
                "must compute in one dtype");
    in.push_back(p.weight);
    layout->slots.emplace_back(in.size() - 1, p.bias.defined() ? in.size() : 0);
    if (p.bias.defined()) in.push_back(p.bias);
  }
  RECORD_FUNCTION("tide::normed_projections", std::vector<c10::IValue>(in.begin(), in.end()));
  return NormedProjectionsFn::apply(at::TensorList(in), layout);
}

}  // namespace tide
