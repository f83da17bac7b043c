#include "sharded_parameters.h"

#include <fmt/format.h>
#include <torch/types.h>

#include "model/tensor_storage.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/parallel/comm.h"

namespace tide {

struct ShardedParameters::Unit {
  int64_t offset = 0, numel = 0;  // in the flat index space; numel padded
  int64_t local_offset = 0;       // where this rank's piece starts in shard_
  std::vector<size_t> slots;      // its parameters, flat_.slots() indices
  // Gathered in the compute dtype: each parameter's own memory, sharing its storage but
  // not its version counter (a gather writing into it is no in-place change of the
  // parameter for autograd), and whether it is held only as its working copy.
  std::vector<at::Tensor> memory;
  std::vector<char> in_compute_dtype;
  at::Tensor whole;  // fp32 [numel], where fp32 gathers land; storageless between them
  at::Tensor wire;   // [numel] in the compute dtype: the gather's buffer, and the unit's values while held
  std::unique_ptr<PendingCollective> gathering;
  bool gathered = false;
  bool exact = false;  // gathered (or on its way) in fp32 into `whole`
  int64_t bytes = 0;   // counted in gathered_bytes_
};

ShardedParameters::ShardedParameters(Comm& dp, const FlatParameters& flat, const ParameterUnitLayout& units,
                                     at::ScalarType wire,
                                     const std::function<bool(const std::string&)>& read_in_compute_dtype, bool frozen)
    : dp_(dp),
      flat_(flat),
      last_block_(units.last_block()),
      keep_embeddings_(units.embeddings_read_after_lookup()),
      frozen_(frozen),
      wire_(wire) {
  TORCH_CHECK(flat.pad_to() % dp.size() == 0, "flat units padded to ", flat.pad_to(), " cannot be cut into ",
              dp.size(), " pieces");
  torch::NoGradGuard no_grad;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(flat.device());
  // A frozen shard under bf16 (fp16) compute is held in that dtype: every gather would
  // round it to the same bits, and nothing updates it or saves it (a checkpoint takes a
  // LoRA base from its initial weights again).
  shard_ = torch::zeros({flat.shard_numel(dp.size())}, opts.dtype(frozen ? wire : at::kFloat));  // padding stays zero
  // Gathered in fp32, the parameters are views of their unit's buffer; in the compute
  // dtype, each has memory of its own that only some of them ever get.
  const bool own_memory = wire_ != at::kFloat;
  units_.resize(flat.units().size());
  int64_t local = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    const auto& layout = flat.units()[u];
    auto& unit = units_[u];
    unit.offset = layout.offset;
    unit.numel = layout.numel;
    unit.slots = layout.slots;
    unit.local_offset = local;
    unit.whole = storageless_empty({layout.numel}, opts);
    const int64_t piece = layout.numel / dp.size();
    const int64_t begin = dp.rank() * piece, end = begin + piece;  // this rank's, in the unit
    for (const size_t i : layout.slots) {
      const auto& s = flat.slots()[i];
      // The part of the parameter in this rank's piece: the only values drawn here.
      const int64_t at = s.offset - layout.offset;
      const int64_t a = std::max(begin, at), b = std::min(end, at + s.numel);
      if (a < b) flat.write_initial_values(s, shard_.narrow(0, local + a - begin, b - a), a - at);
      if (!own_memory) {
        s.param.set_data(unit.whole.narrow(0, at, s.numel).view(s.shape));
        continue;
      }
      unit.memory.push_back(storageless_empty(s.shape, opts));
      s.param.set_data(unit.memory.back());
      unit.in_compute_dtype.push_back(read_in_compute_dtype && read_in_compute_dtype(s.name) ? 1 : 0);
    }
    local += piece;
  }
}

ShardedParameters::~ShardedParameters() {
  for (auto& unit : units_) {
    if (unit.gathering) unit.gathering->wait();
    drop_working_copies(&unit);
  }
}

void ShardedParameters::count(Unit& unit, int64_t bytes) {
  unit.bytes += bytes;
  gathered_bytes_ += bytes;
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
}

void ShardedParameters::prefetch(int u, bool exact) {
  const auto i = static_cast<size_t>(u);
  if (u < 0 || i >= units_.size()) return;
  auto& unit = units_[i];
  if (unit.gathered || unit.gathering || unit.numel == 0) return;
  const int64_t piece = unit.numel / dp_.size();
  const auto mine = shard_.narrow(0, unit.local_offset, piece);
  const std::string what = fmt::format("parameters of unit {}", u);
  if (exact || wire_ == at::kFloat) {
    allocate_storage(unit.whole);
    count(unit, unit.numel * static_cast<int64_t>(sizeof(float)));
    unit.exact = true;
    unit.gathering = dp_.all_gather_async(mine, unit.whole, what);
    return;
  }
  // This rank's piece cast for this gather alone (the collective holds it until done),
  // as FSDP does: no second copy of the shard is kept.
  torch::NoGradGuard no_grad;
  unit.wire = torch::empty({unit.numel}, shard_.options().dtype(wire_));
  count(unit, unit.numel * static_cast<int64_t>(unit.wire.element_size()));
  unit.gathering = dp_.all_gather_async(mine.to(wire_), unit.wire, what);
}

void ShardedParameters::gather(int u) {
  auto& unit = units_[static_cast<size_t>(u)];
  if (unit.gathered) return;
  prefetch(u);
  if (unit.gathering) {
    unit.gathering->wait();
    unit.gathering.reset();
  }
  if (unit.exact) {
    // Each parameter's own memory, where it has one, points into the fp32 buffer.
    for (size_t k = 0; k < unit.memory.size(); ++k) {
      const auto& s = flat_.slots()[unit.slots[k]];
      borrow_storage(unit.memory[k], unit.whole.narrow(0, s.offset - unit.offset, s.numel));
    }
  } else if (unit.wire.defined()) {
    hold_in_wire_dtype(unit);
  }
  unit.gathered = true;
}

void ShardedParameters::hold_in_wire_dtype(Unit& unit) {
  torch::NoGradGuard no_grad;
  std::vector<StandingCopy> copies;
  for (size_t k = 0; k < unit.memory.size(); ++k) {
    const auto& s = flat_.slots()[unit.slots[k]];
    const auto values = unit.wire.narrow(0, s.offset - unit.offset, s.numel).view(s.shape);
    if (unit.in_compute_dtype[k]) {
      copies.push_back({s.param, values});
      continue;
    }
    allocate_storage(unit.memory[k]);
    count(unit, s.numel * static_cast<int64_t>(sizeof(float)));
    unit.memory[k].copy_(values);
  }
  if (!copies.empty()) {
    keep_working_copies(&unit, {}, copies);
    return;
  }
  count(unit, -unit.numel * static_cast<int64_t>(unit.wire.element_size()));  // all widened: the buffer goes
  unit.wire = at::Tensor();
}

void ShardedParameters::release(int u) {
  auto& unit = units_[static_cast<size_t>(u)];
  if (unit.gathering) {  // never free memory a collective is still writing
    unit.gathering->wait();
    unit.gathering.reset();
  } else if (!unit.gathered) {
    return;
  }
  drop_working_copies(&unit);
  for (const auto& m : unit.memory) release_storage(m);
  if (unit.exact) release_storage(unit.whole);
  unit.wire = at::Tensor();
  unit.gathered = unit.exact = false;
  gathered_bytes_ -= unit.bytes;
  unit.bytes = 0;
}

void ShardedParameters::before_forward(int unit) {
  gather(unit);
  prefetch(unit + 1);
}

at::Tensor ShardedParameters::after_forward(int unit, const at::Tensor& y) {
  if (unit == 0) {
    if (!keep_embeddings_) release(0);
    return y;
  }
  if (!y.requires_grad()) {
    release(unit);
    return y;
  }
  // The last block's backward comes right after the head's: keep it rather than gather
  // it again.
  if (unit != last_block_) release(unit);
  return call_before_backward(y, *this, unit);
}

void ShardedParameters::before_backward(int unit) {
  // Frozen: what backward has passed is done (the last block's unit then the head's, above
  // it in index).
  if (frozen_)
    for (size_t above = static_cast<size_t>(unit) + 1; above < units_.size(); ++above) release(static_cast<int>(above));
  gather(unit);
  if (unit > 1) prefetch(unit - 1);
}

void ShardedParameters::end_forward() { release_all(); }

void ShardedParameters::gather_exact(int u) {
  TORCH_CHECK(shard_.scalar_type() == at::kFloat, "ShardedParameters: a shard held in ", shard_.scalar_type(),
              " has no fp32 values to gather");
  // Gathered (or on its way) in the wire dtype, it would hold rounded values.
  const auto& unit = units_[static_cast<size_t>(u)];
  if ((unit.gathering || unit.gathered) && !unit.exact) release(u);
  prefetch(u, /*exact=*/true);
  gather(u);
}

void ShardedParameters::release_all() {
  for (size_t u = 0; u < units_.size(); ++u) release(static_cast<int>(u));
}

}  // namespace tide
