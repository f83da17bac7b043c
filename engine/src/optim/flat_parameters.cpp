#include "tide/engine/optim/flat_parameters.h"

#include <torch/torch.h>

#include "tide/engine/model/transformer.h"

namespace tide {

FlatParameters::FlatParameters(torch::nn::Module& model, const OptimConfig& optim, int64_t pad_to) {
  std::vector<Slot> decayed, plain;
  torch::Device device(torch::kCPU);
  for (auto& item : model.named_parameters()) {
    Slot s;
    s.name = item.key();
    s.param = item.value();
    s.numel = s.param.numel();
    s.shape = s.param.sizes().vec();
    s.decayed = is_decayed(s.name, s.param, optim.decay_norms_and_biases, optim.decay_embeddings);
    device = s.param.device();
    (s.decayed ? decayed : plain).push_back(std::move(s));
  }
  slots_ = std::move(decayed);
  for (auto& s : slots_) decay_numel_ += s.numel;
  for (auto& s : plain) slots_.push_back(std::move(s));

  int64_t total = 0;
  for (auto& s : slots_) {
    s.offset = total;
    total += s.numel;
  }
  parameter_numel_ = total;
  if (pad_to > 1) total = (total + pad_to - 1) / pad_to * pad_to;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  data_ = torch::zeros({total}, opts);
  grad_ = torch::zeros({total}, opts);
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    auto view = data_.narrow(0, s.offset, s.numel).view(s.shape);
    view.copy_(s.param);
    s.param.set_data(view);
    // Autograd accumulates into an existing .grad in place, so gradients land here.
    s.param.mutable_grad() = grad_.narrow(0, s.offset, s.numel).view(s.shape);
  }
}

}  // namespace tide
