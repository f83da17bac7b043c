#include "tide/engine/optim/flat_parameters.h"

#include <algorithm>

#include <torch/types.h>

#include "tide/engine/optim/weight_decay.h"

namespace tide {

FlatParameters::FlatParameters(torch::nn::Module& model, const OptimConfig& optim, Options options)
    : pad_to_(std::max<int64_t>(1, options.pad_to)), initial_values_(std::move(options.initial_values)) {
  TORCH_CHECK(!options.frozen || !options.grad, "frozen parameters have no gradient buffer");
  std::vector<Slot> all;
  int n_units = 1;
  for (auto& item : model.named_parameters()) {
    // Frozen (LoRA's base weights): no gradient, no optimizer state, no share of the
    // collectives; the model's own tensor. Its unit is laid out all the same (empty where
    // it holds nothing else): units keep their indices. The other way round in a layout
    // of the frozen ones; likewise for what Options::takes leaves out.
    if (item.value().requires_grad() == options.frozen || (options.takes && !options.takes(item.key()))) {
      if (options.unit_of) n_units = std::max(n_units, options.unit_of(item.key()) + 1);
      continue;
    }
    Slot s;
    s.name = item.key();
    s.param = item.value();
    s.unit = options.unit_of ? options.unit_of(s.name) : 0;
    TORCH_CHECK(s.unit >= 0, "parameter ", s.name, " has no unit");
    s.numel = s.param.numel();
    s.shape = s.param.sizes().vec();
    s.decayed = is_decayed(s.name, s.param, optim.decay_norms_and_biases, optim.decay_embeddings);
    s.counted = !options.counted || options.counted(s.name);
    device_ = s.param.device();
    n_units = std::max(n_units, s.unit + 1);
    all.push_back(std::move(s));
  }
  // Unit by unit; within a unit decayed parameters first, then counted ones first, each
  // group in model order.
  std::stable_sort(all.begin(), all.end(), [](const Slot& a, const Slot& b) {
    if (a.unit != b.unit) return a.unit < b.unit;
    if (a.decayed != b.decayed) return a.decayed;
    return a.counted && !b.counted;
  });
  units_.resize(static_cast<size_t>(n_units));
  int64_t total = 0;
  size_t i = 0;
  for (int u = 0; u < n_units; ++u) {
    Unit& unit = units_[static_cast<size_t>(u)];
    unit.offset = total;
    for (; i < all.size() && all[i].unit == u; ++i) {
      all[i].offset = total;
      total += all[i].numel;
      if (all[i].decayed) unit.decay_numel += all[i].numel;
      if (all[i].counted) (all[i].decayed ? unit.counted_decay_numel : unit.counted_plain_numel) += all[i].numel;
      unit.slots.push_back(i);
    }
    total = (total + pad_to_ - 1) / pad_to_ * pad_to_;
    unit.numel = total - unit.offset;
  }
  slots_ = std::move(all);
  numel_ = total;

  if (options.device) device_ = *options.device;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
  torch::NoGradGuard no_grad;
  if (options.data) data_ = torch::zeros({numel_}, opts);
  if (options.grad) grad_ = torch::zeros({numel_}, opts);
  for (auto& s : slots_) {
    if (options.data) {
      const auto flat = data_.narrow(0, s.offset, s.numel);
      write_initial_values(s, flat);
      s.param.set_data(flat.view(s.shape));
    }
    // Autograd accumulates into an existing .grad in place, so gradients land here.
    if (options.grad) s.param.mutable_grad() = grad_.narrow(0, s.offset, s.numel).view(s.shape);
  }
}

void FlatParameters::write_initial_values(const Slot& slot, const torch::Tensor& into, int64_t first) const {
  torch::NoGradGuard no_grad;
  if (initial_values_)
    initial_values_(slot.name, into, first);
  else
    into.copy_(slot.param.reshape({-1}).narrow(0, first, into.numel()).view(into.sizes()));
}

void FlatParameters::zero_grad() {
  if (grad_.defined()) grad_.zero_();
}

std::vector<OptimSegment> FlatParameters::segments() const { return shard_segments(0, 1, false, false); }

std::vector<OptimSegment> FlatParameters::shard_segments(int rank, int ranks, bool local_params,
                                                         bool local_grads) const {
  TORCH_CHECK(ranks >= 1 && rank >= 0 && rank < ranks && pad_to_ % ranks == 0, "cannot cut units padded to ",
              pad_to_, " into ", ranks, " pieces");
  std::vector<OptimSegment> out;
  int64_t local = 0;
  for (const auto& unit : units_) {
    const int64_t piece = unit.numel / ranks;
    const int64_t begin = unit.offset + rank * piece, end = begin + piece;
    // [decayed, counted) [decayed, not counted) [plain, counted) [plain, not counted + padding)
    const int64_t bounds[5] = {unit.offset, unit.offset + unit.counted_decay_numel, unit.offset + unit.decay_numel,
                               unit.offset + unit.decay_numel + unit.counted_plain_numel, unit.offset + unit.numel};
    for (int k = 0; k < 4; ++k) {
      const int64_t a = std::max(begin, bounds[k]), b = std::min(end, bounds[k + 1]);
      if (a >= b) continue;
      const int64_t at = local + (a - begin);
      out.push_back({local_params ? at : a, local_grads ? at : a, b - a, k < 2, k % 2 == 0});
    }
    local += piece;
  }
  return out;
}

}  // namespace tide
