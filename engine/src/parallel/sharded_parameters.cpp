#include "sharded_parameters.h"

#include <fmt/format.h>
#include <torch/types.h>

#include "tide/engine/parallel/comm.h"

namespace tide {

namespace {
// The storage under `t` (and every view of it) without its memory, and with it again.
// The StorageImpl itself stays, so tensors that autograd saved keep pointing at it.
void free_storage(const torch::Tensor& t) {
  auto* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, t.device()));
  s->set_nbytes(0);
}

void allocate_storage(const torch::Tensor& t) {
  auto* s = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
  s->set_data_ptr_noswap(s->allocator()->allocate(nbytes));
  s->set_nbytes(nbytes);
}
}  // namespace

ShardedParameters::ShardedParameters(Comm& dp, FlatParameters& flat) : dp_(dp) {
  TORCH_CHECK(flat.pad_to() % dp.size() == 0, "flat units padded to ", flat.pad_to(), " cannot be cut into ",
              dp.size(), " pieces");
  torch::NoGradGuard no_grad;
  const auto device = flat.slots().empty() ? torch::Device(torch::kCPU) : flat.slots()[0].param.device();
  const auto opts = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  shard_ = torch::zeros({flat.shard_numel(dp.size())}, opts);
  const size_t n = flat.units().size();
  whole_.resize(n);
  gathering_.resize(n);
  gathered_.assign(n, 1);
  int64_t local = 0;
  for (size_t u = 0; u < n; ++u) {
    const auto& unit = flat.units()[u];
    const int64_t piece = unit.numel / dp.size();
    local_offset_.push_back(local);
    whole_[u] = torch::zeros({unit.numel}, opts);
    gathered_bytes_ += unit.numel * static_cast<int64_t>(sizeof(float));
    for (const size_t i : unit.slots) {
      const auto& s = flat.slots()[i];
      auto view = whole_[u].narrow(0, s.offset - unit.offset, s.numel).view(s.shape);
      view.copy_(s.param);
      s.param.set_data(view);
    }
    shard_.narrow(0, local, piece).copy_(whole_[u].narrow(0, dp.rank() * piece, piece));
    local += piece;
  }
  release_all();
  peak_gathered_bytes_ = 0;
}

ShardedParameters::~ShardedParameters() {
  for (auto& g : gathering_)
    if (g) g->wait();
}

void ShardedParameters::allocate(int u) {
  auto& whole = whole_[static_cast<size_t>(u)];
  allocate_storage(whole);
  gathered_bytes_ += whole.numel() * static_cast<int64_t>(sizeof(float));
  peak_gathered_bytes_ = std::max(peak_gathered_bytes_, gathered_bytes_);
}

void ShardedParameters::prefetch(int u) {
  const auto i = static_cast<size_t>(u);
  if (u < 0 || i >= whole_.size() || gathered_[i] || gathering_[i] || whole_[i].numel() == 0) return;
  allocate(u);
  const int64_t piece = whole_[i].numel() / dp_.size();
  gathering_[i] = dp_.all_gather_async(shard_.narrow(0, local_offset_[i], piece), whole_[i],
                                       fmt::format("parameters of unit {}", u));
}

void ShardedParameters::gather(int u) {
  const auto i = static_cast<size_t>(u);
  if (gathered_[i]) return;
  prefetch(u);
  if (gathering_[i]) {
    gathering_[i]->wait();
    gathering_[i].reset();
  }
  gathered_[i] = 1;
}

void ShardedParameters::release(int u) {
  const auto i = static_cast<size_t>(u);
  if (gathering_[i]) {  // never free memory a collective is still writing
    gathering_[i]->wait();
    gathering_[i].reset();
  } else if (!gathered_[i]) {
    return;
  }
  gathered_[i] = 0;
  if (whole_[i].numel() == 0) return;
  free_storage(whole_[i]);
  gathered_bytes_ -= whole_[i].numel() * static_cast<int64_t>(sizeof(float));
}

void ShardedParameters::before_forward(int unit) {
  gather(unit);
  prefetch(unit + 1);
}

at::Tensor ShardedParameters::after_forward(int unit, const at::Tensor& y) {
  if (!y.requires_grad()) {
    release(unit);
    return y;
  }
  // The last block's backward comes next: keep it rather than gather it again.
  if (static_cast<size_t>(unit) + 1 < whole_.size()) release(unit);
  return call_before_backward(y, *this, unit);
}

void ShardedParameters::before_backward(int unit) {
  gather(unit);
  if (unit > 1) prefetch(unit - 1);
}

void ShardedParameters::end_forward() { release(0); }

void ShardedParameters::gather_all() {
  for (size_t u = 0; u < whole_.size(); ++u) prefetch(static_cast<int>(u));
  for (size_t u = 0; u < whole_.size(); ++u) gather(static_cast<int>(u));
}

void ShardedParameters::release_all() {
  for (size_t u = 0; u < whole_.size(); ++u) release(static_cast<int>(u));
}

}  // namespace tide
