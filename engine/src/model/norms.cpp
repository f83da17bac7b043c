#include "norms.h"

#include <torch/types.h>

#include "cuda_kernel_args.h"
#include "tide/engine/model/fused_ops.h"

namespace tide {
namespace {
// The dtype a norm's statistics are computed in for input x.
at::ScalarType statistics_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}
}  // namespace

std::pair<at::Tensor, NormState> rms_norm_forward(const at::Tensor& x, const at::Tensor& weight, double eps) {
  NormState s;
  s.weight_dtype = weight.scalar_type();
#ifdef TIDE_LAUNCHES_KERNELS
  if (fused_kernels_take(x)) {
    s.x = x.contiguous();  // the kernel keeps x as given
    s.weight = aligned_to_16_bytes(weight.to(at::kFloat).contiguous());  // the warp path's 16-byte loads
    const int64_t cols = x.size(-1), rows = s.x.numel() / cols;
    auto y = at::empty_like(s.x);
    s.rstd = at::empty({rows}, x.options().dtype(at::kFloat));
    kernels::rms_norm_forward(s.x.data_ptr(), s.weight.const_data_ptr<float>(), y.data_ptr(), s.rstd.data_ptr<float>(),
                              rows, cols, static_cast<float>(eps), element_of(s.x), stream_of(s.x));
    return {y, s};
  }
#endif
  s.x = x.to(statistics_dtype(x));
  s.weight = weight.to(s.x.scalar_type());
  s.rstd = at::rsqrt(s.x.pow(2).mean(-1, /*keepdim=*/true).add_(eps));
  return {(s.x * s.rstd).mul_(s.weight).to(x.scalar_type()), s};
}

std::pair<at::Tensor, NormState> layer_norm_forward(const at::Tensor& x, const at::Tensor& weight,
                                                    const at::Tensor& bias, double eps) {
  NormState s;
  s.x = x.to(statistics_dtype(x));
  s.weight = weight.to(s.x.scalar_type());
  s.weight_dtype = weight.scalar_type();
  if (bias.defined()) {
    s.bias = bias.to(s.x.scalar_type());
    s.bias_dtype = bias.scalar_type();
  }
  auto [y, mean, rstd] = at::native_layer_norm(s.x, {x.size(-1)}, s.weight, s.bias, eps);
  s.mean = mean;
  s.rstd = rstd;
  return {y.to(x.scalar_type()), s};
}

NormGradients norm_backward(const at::Tensor& dy, const NormState& s, const at::Tensor& dx_add) {
  const auto& x = s.x;
  if (s.mean.defined()) {  // LayerNorm: LibTorch's backward of native_layer_norm
    auto [dx, dw, db] = at::native_layer_norm_backward(dy.to(x.scalar_type()), x, {x.size(-1)}, s.mean, s.rstd,
                                                       s.weight, s.bias, {true, true, s.bias.defined()});
    if (dx_add.defined()) dx.add_(dx_add);
    return {dx, dw.to(s.weight_dtype), db.defined() ? db.to(s.bias_dtype) : db};
  }
  // RMSNorm: dw = sum_rows(g x r); dx = r (g w - x r^2 mean(g w x)).
#ifdef TIDE_LAUNCHES_KERNELS
  if (fused_kernels_take(x)) {  // what forward kept decides: the kernel keeps x as given
    const auto g = dy.to(x.scalar_type()).contiguous();
    const int64_t cols = x.size(-1), rows = x.numel() / cols;
    const auto add = dx_add.defined() ? dx_add.to(x.scalar_type()).contiguous() : at::Tensor();
    auto dx = at::empty_like(x);
    auto partial = at::empty({kernels::rms_norm_partials(rows), cols}, x.options().dtype(at::kFloat));
    kernels::rms_norm_backward(g.data_ptr(), x.data_ptr(), s.weight.const_data_ptr<float>(),
                               s.rstd.const_data_ptr<float>(), add.defined() ? add.const_data_ptr() : nullptr,
                               dx.data_ptr(), partial.data_ptr<float>(), rows, cols, element_of(x), stream_of(x));
    return {dx, partial.sum(0).to(s.weight_dtype), {}};
  }
#endif
  const auto g = dy.to(x.scalar_type());
  const auto xr = x * s.rstd;
  const auto dw = (g * xr).reshape({-1, x.size(-1)}).sum(0);
  const auto gw = g * s.weight;
  const auto dot = (gw * xr).mean(-1, /*keepdim=*/true);
  auto dx = (gw - xr * dot).mul_(s.rstd);
  if (dx_add.defined()) dx.add_(dx_add);
  return {dx, dw.to(s.weight_dtype), {}};
}

}  // namespace tide
