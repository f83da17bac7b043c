#include "sharded_gradients.h"

#include <algorithm>

#include <fmt/format.h>
#include <torch/types.h>

#include "gradient_hooks.h"
#include "tide/engine/parallel/comm.h"

namespace tide {

struct ShardedGradients::Inflight {
  int unit = 0;
  std::unique_ptr<PendingCollective> work;
  torch::Tensor in;   // Transient: the unit's gradients of one micro-batch
  torch::Tensor out;  // Transient: the reduced piece, added into shard_ once complete
};

ShardedGradients::ShardedGradients(Comm& dp, FlatParameters& flat, Mode mode, std::function<void(int)> on_unit_done)
    : dp_(dp), flat_(flat), mode_(mode), on_unit_done_(std::move(on_unit_done)) {
  const int n_ranks = dp.size();
  TORCH_CHECK(flat.pad_to() % n_ranks == 0, "flat units padded to ", flat.pad_to(), " cannot be cut into ", n_ranks,
              " pieces");
  TORCH_CHECK(mode == Mode::Transient || flat.grad().defined(), "ZeRO-1 gradients need the whole gradient buffer");
  int64_t local = 0;
  for (const auto& unit : flat.units()) {
    pending_init_.push_back(static_cast<int>(unit.slots.size()));
    local_offset_.push_back(local);
    local += unit.numel / n_ranks;
  }
  unit_grad_.resize(flat.units().size());
  pending_ = pending_init_;
  ready_.assign(pending_init_.size(), 0);
  armed_.assign(pending_init_.size(), 0);
  reduced_.assign(pending_init_.size(), 0);
  if (mode == Mode::Transient) {
    shard_ = torch::zeros({local}, torch::TensorOptions().dtype(torch::kFloat32).device(flat.device()));
  }
  hooks_ = hook_gradient_ready(flat, [this](size_t slot) { on_ready(slot); });
}

ShardedGradients::~ShardedGradients() = default;

void ShardedGradients::begin_backward(bool reduce, const std::vector<int>& units) {
  std::lock_guard<std::mutex> lock(mu_);
  // The previous pass is over: what it armed is final (a unit whose gradients never all
  // came, a parameter unused in that pass, is sent as it is). Its collectives, still in
  // flight, stay so.
  settle();
  std::fill(armed_.begin(), armed_.end(), 0);
  if (!reduce && mode_ == Mode::InPlace) return;
  for (const int u : units) {
    const auto k = static_cast<size_t>(u);
    TORCH_CHECK(k < pending_.size(), "backward of unit ", u, " of ", pending_.size());
    pending_[k] = pending_init_[k];
    ready_[k] = pending_[k] == 0;  // a unit with no parameters on this rank
    armed_[k] = 1;
    order_.push_back(u);
  }
}

void ShardedGradients::on_ready(size_t slot) {
  torch::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(mu_);
  const auto& s = flat_.slots()[slot];
  const auto u = static_cast<size_t>(s.unit);
  if (!armed_[u]) return;
  if (mode_ == Mode::Transient) {
    const torch::Tensor g = s.param.grad();
    if (g.defined()) {
      const auto& unit = flat_.units()[u];
      if (!unit_grad_[u].defined()) {
        unit_grad_[u] = torch::zeros({unit.numel}, g.options());
        transient_bytes_ += unit.numel * static_cast<int64_t>(sizeof(float));
        peak_transient_bytes_ = std::max(peak_transient_bytes_, transient_bytes_);
      }
      unit_grad_[u].narrow(0, s.offset - unit.offset, s.numel).add_(g.reshape({-1}));
      s.param.mutable_grad().reset();
    }
  }
  if (--pending_[u] == 0) complete_unit(s.unit);
}

void ShardedGradients::complete_unit(int unit) {
  ready_[static_cast<size_t>(unit)] = 1;
  if (on_unit_done_) on_unit_done_(unit);
  launch_in_order();
}

void ShardedGradients::launch_in_order() {
  while (next_ < order_.size() && ready_[static_cast<size_t>(order_[next_])]) launch(order_[next_++]);
}

void ShardedGradients::launch(int u) {
  const auto& unit = flat_.units()[static_cast<size_t>(u)];
  reduced_[static_cast<size_t>(u)] = 1;
  if (unit.numel == 0) return;
  const int64_t piece = unit.numel / dp_.size();
  auto job = std::make_unique<Inflight>();
  job->unit = u;
  const std::string what = fmt::format("gradients of unit {}", u);
  if (mode_ == Mode::InPlace) {
    auto in = flat_.grad().narrow(0, unit.offset, unit.numel);
    job->work = dp_.reduce_scatter_sum_async(in, in.narrow(0, dp_.rank() * piece, piece), what);
  } else {
    collect_leftover(u);
    // The job takes the buffer: the next micro-batch's gradients of this unit go to a
    // new one while this one is still on the wire.
    job->in = std::move(unit_grad_[static_cast<size_t>(u)]);
    unit_grad_[static_cast<size_t>(u)] = torch::Tensor();
    if (!job->in.defined()) {  // none of its gradients came
      job->in = torch::zeros({unit.numel}, shard_.options());
      transient_bytes_ += unit.numel * static_cast<int64_t>(sizeof(float));
    }
    job->out = torch::empty({piece}, shard_.options());
    job->work = dp_.reduce_scatter_sum_async(job->in, job->out, what);
  }
  inflight_.push_back(std::move(job));
  // Two collectives in flight overlap backward; more would only hold more buffers.
  while (inflight_.size() > 2) retire_oldest();
}

void ShardedGradients::collect_leftover(int u) {
  // Gradients no hook took: a unit reduced only in finish(), whose parameters kept
  // theirs over the step.
  const auto& unit = flat_.units()[static_cast<size_t>(u)];
  auto& buffer = unit_grad_[static_cast<size_t>(u)];
  for (const size_t i : unit.slots) {
    const auto& s = flat_.slots()[i];
    const torch::Tensor g = s.param.grad();
    if (!g.defined()) continue;
    if (!buffer.defined()) {
      buffer = torch::zeros({unit.numel}, g.options());
      transient_bytes_ += unit.numel * static_cast<int64_t>(sizeof(float));
      peak_transient_bytes_ = std::max(peak_transient_bytes_, transient_bytes_);
    }
    buffer.narrow(0, s.offset - unit.offset, s.numel).add_(g.reshape({-1}));
    s.param.mutable_grad().reset();
  }
}

void ShardedGradients::retire_oldest() {
  auto job = std::move(inflight_.front());
  inflight_.erase(inflight_.begin());
  job->work->wait();
  if (mode_ != Mode::Transient) return;
  const auto u = static_cast<size_t>(job->unit);
  shard_.narrow(0, local_offset_[u], job->out.numel()).add_(job->out);
  transient_bytes_ -= job->in.numel() * static_cast<int64_t>(sizeof(float));
}

void ShardedGradients::settle() {
  for (size_t k = next_; k < order_.size(); ++k)
    if (!ready_[static_cast<size_t>(order_[k])]) complete_unit(order_[k]);
  launch_in_order();
}

int ShardedGradients::units_held() const {
  return static_cast<int>(std::count_if(pending_init_.begin(), pending_init_.end(), [](int n) { return n > 0; }));
}

int ShardedGradients::finish() {
  torch::NoGradGuard no_grad;
  std::lock_guard<std::mutex> lock(mu_);
  settle();
  std::fill(armed_.begin(), armed_.end(), 0);
  int during_backward = 0;
  for (size_t u = 0; u < reduced_.size(); ++u) during_backward += reduced_[u] && pending_init_[u] > 0;
  // Units no pass reduced: their gradients are final now, wherever they wait.
  for (size_t u = reduced_.size(); u-- > 0;) {
    if (reduced_[u]) continue;
    ready_[u] = 1;
    order_.push_back(static_cast<int>(u));
  }
  launch_in_order();
  while (!inflight_.empty()) retire_oldest();
  order_.clear();
  next_ = 0;
  std::fill(reduced_.begin(), reduced_.end(), 0);
  return during_backward;
}

}  // namespace tide
