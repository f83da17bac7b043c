#include "tide/engine/model/parameter_units.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/types.h>

namespace tide {

namespace {
struct BeforeBackward : torch::autograd::Function<BeforeBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& y, int64_t owner,
                               int64_t unit) {
    ctx->saved_data["owner"] = owner;
    ctx->saved_data["unit"] = unit;
    return y;  // autograd returns it as a view carrying this node
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* units = reinterpret_cast<ParameterUnits*>(ctx->saved_data["owner"].toInt());
    units->before_backward(static_cast<int>(ctx->saved_data["unit"].toInt()));
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};
}  // namespace

at::Tensor call_before_backward(const at::Tensor& y, ParameterUnits& units, int unit) {
  return BeforeBackward::apply(y, static_cast<int64_t>(reinterpret_cast<intptr_t>(&units)), static_cast<int64_t>(unit));
}

}  // namespace tide
