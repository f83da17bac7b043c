#include "sharded_parameters.h"

#include <fmt/format.h>
#include <torch/types.h>

#include "model/tensor_storage.h"
#include "tide/engine/parallel/comm.h"

namespace tide {

ShardedParameters::ShardedParameters(Comm& dp, FlatParameters& flat, const ParameterUnitLayout& units,
                                     at::ScalarType wire)
    : dp_(dp), last_block_(units.last_block()), keep_embeddings_(units.embeddings_read_after_lookup()), wire_(wire) {
  TORCH_CHECK(flat.pad_to() % dp.size() == 0, "flat units padded to ", flat.pad_to(), " cannot be cut into ",
              dp.size(), " pieces");
  torch::NoGradGuard no_grad;
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(flat.device());
  shard_ = torch::zeros({flat.shard_numel(dp.size())}, opts);  // the padding stays zero
  const size_t n = flat.units().size();
  whole_.resize(n);
  wire_whole_.resize(n);
  gathering_.resize(n);
  gathered_.assign(n, 0);
  int64_t local = 0;
  for (size_t u = 0; u < n; ++u) {
    const auto& unit = flat.units()[u];
    const int64_t piece = unit.numel / dp.size();
    const int64_t begin = dp.rank() * piece, end = begin + piece;  // this rank's, in the unit
    local_offset_.push_back(local);
    whole_[u] = storageless_empty({unit.numel}, opts);
    for (const size_t i : unit.slots) {
      const auto& s = flat.slots()[i];
      // The part of the parameter in this rank's piece: the only values drawn here.
      const int64_t at = s.offset - unit.offset;
      const int64_t a = std::max(begin, at), b = std::min(end, at + s.numel);
      if (a < b) flat.write_initial_values(s, shard_.narrow(0, local + a - begin, b - a), a - at);
      s.param.set_data(whole_[u].narrow(0, at, s.numel).view(s.shape));
    }
    local += piece;
  }
}

ShardedParameters::~ShardedParameters() {
  for (auto& g : gathering_)
    if (g) g->wait();
}

void ShardedParameters::count(int64_t bytes) {
  gathered_bytes_ += bytes;
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
}

void ShardedParameters::allocate(int u) {
  auto& whole = whole_[static_cast<size_t>(u)];
  allocate_storage(whole);
  count(whole.numel() * static_cast<int64_t>(sizeof(float)));
}

void ShardedParameters::prefetch(int u, bool exact) {
  const auto i = static_cast<size_t>(u);
  if (u < 0 || i >= whole_.size() || gathered_[i] || gathering_[i] || whole_[i].numel() == 0) return;
  const int64_t piece = whole_[i].numel() / dp_.size();
  const std::string what = fmt::format("parameters of unit {}", u);
  if (exact || wire_ == at::kFloat) {
    allocate(u);
    gathering_[i] = dp_.all_gather_async(shard_.narrow(0, local_offset_[i], piece), whole_[i], what);
    return;
  }
  // This rank's piece cast for this gather alone (the collective holds it until done),
  // as FSDP does: no second copy of the shard is kept. The fp32 parameters are allocated
  // once the pieces are in (gather): while the gather runs, only its buffer is held.
  torch::NoGradGuard no_grad;
  auto& buffer = wire_whole_[i];
  buffer = torch::empty({whole_[i].numel()}, shard_.options().dtype(wire_));
  count(buffer.numel() * static_cast<int64_t>(buffer.element_size()));
  gathering_[i] = dp_.all_gather_async(shard_.narrow(0, local_offset_[i], piece).to(wire_), buffer, what);
}

void ShardedParameters::gather(int u) {
  const auto i = static_cast<size_t>(u);
  if (gathered_[i]) return;
  prefetch(u);
  if (gathering_[i]) {
    gathering_[i]->wait();
    gathering_[i].reset();
  }
  if (wire_whole_[i].defined()) {
    torch::NoGradGuard no_grad;
    allocate(u);
    whole_[i].copy_(wire_whole_[i]);
    drop_wire_buffer(u);
  }
  gathered_[i] = 1;
}

void ShardedParameters::drop_wire_buffer(int u) {
  auto& buffer = wire_whole_[static_cast<size_t>(u)];
  gathered_bytes_ -= buffer.numel() * static_cast<int64_t>(buffer.element_size());
  buffer = torch::Tensor();
}

void ShardedParameters::release(int u) {
  const auto i = static_cast<size_t>(u);
  if (gathering_[i]) {  // never free memory a collective is still writing
    gathering_[i]->wait();
    gathering_[i].reset();
  } else if (!gathered_[i]) {
    return;
  }
  if (wire_whole_[i].defined()) {  // prefetched, never used: its fp32 storage was never allocated
    drop_wire_buffer(u);
    return;
  }
  gathered_[i] = 0;
  if (whole_[i].numel() == 0) return;
  release_storage(whole_[i]);
  gathered_bytes_ -= whole_[i].numel() * static_cast<int64_t>(sizeof(float));
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
  gather(unit);
  if (unit > 1) prefetch(unit - 1);
}

void ShardedParameters::end_forward() { release_all(); }

void ShardedParameters::gather_exact(int unit) {
  const auto i = static_cast<size_t>(unit);
  // Gathered (or on its way) in the wire dtype, it would hold rounded values.
  if (wire_ != at::kFloat && (gathering_[i] || gathered_[i])) release(unit);
  prefetch(unit, /*exact=*/true);
  gather(unit);
}

void ShardedParameters::release_all() {
  for (size_t u = 0; u < whole_.size(); ++u) release(static_cast<int>(u));
}

}  // namespace tide
