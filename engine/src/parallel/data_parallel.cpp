#include "tide/engine/parallel/data_parallel.h"

#include <cmath>
#include <deque>
#include <mutex>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/types.h>

#include "gradient_hooks.h"
#include "sharded_gradients.h"
#include "sharded_parameters.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/parameter_units.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/parallel/comm.h"

namespace tide {

// Stage 0: the flat gradient buffer cut into buckets of bucket_mb, each all-reduced as
// soon as backward has produced all of its gradients. Every rank must start the
// collectives in the same order: the first step records the order in which buckets
// complete (and reduces after backward), checks that all ranks saw the same, and later
// steps launch in it.
struct DataParallel::Buckets {
  int64_t elems = 0;
  std::vector<std::vector<int>> slot_buckets;  // buckets each parameter slot touches
  std::vector<int> pending_init, pending;      // slots still to deliver, per bucket
  GradientHooks hooks;
  std::vector<char> armed_units;  // units in their last pass of the step, now
  std::vector<int> order;         // agreed launch order; empty until then
  std::vector<int> completed;     // completion order in this step
  std::vector<char> ready;
  size_t next = 0;  // position in `order`
  std::vector<std::unique_ptr<PendingCollective>> works;
  bool armed = false, enabled = true;  // armed: some unit reduces during backward this step
  std::mutex mu;

  void reset() {
    pending = pending_init;
    ready.assign(pending.size(), 0);
    works.clear();
    works.resize(pending.size());
    completed.clear();
    next = 0;
    armed = false;
  }

  void launch_ready(Comm& dp, torch::Tensor& g) {
    while (next < order.size() && ready[static_cast<size_t>(order[next])]) {
      const int b = order[next++];
      const int64_t at = b * elems;
      works[static_cast<size_t>(b)] =
          dp.all_reduce_sum_async(g.narrow(0, at, std::min(elems, g.numel() - at)), fmt::format("gradient bucket {}", b));
    }
  }
};

FlatParameters::Options DataParallel::flat_options(const ParallelConfig& cfg, int ranks) {
  FlatParameters::Options o;
  o.pad_to = ranks;
  o.data = cfg.zero < 3;
  o.grad = cfg.zero < 2;
  return o;
}

// Stage 3 under LoRA: the adapters and the frozen base, each sharded, told of the same
// units (likewise a rank's experts beside the rest). Their backward wrappers nest: both
// hear a unit's backward begin.
struct DataParallel::BothUnits : ParameterUnits {
  ParameterUnits& first;
  ParameterUnits& second;
  BothUnits(ParameterUnits& a, ParameterUnits& b) : first(a), second(b) {}
  void before_forward(int unit) override {
    first.before_forward(unit);
    second.before_forward(unit);
  }
  at::Tensor after_forward(int unit, const at::Tensor& y) override {
    return second.after_forward(unit, first.after_forward(unit, y));
  }
  void before_backward(int unit) override {
    first.before_backward(unit);
    second.before_backward(unit);
  }
  void end_forward() override {
    first.end_forward();
    second.end_forward();
  }
};

DataParallel::~DataParallel() = default;

DataParallel::DataParallel(Comm& dp, FlatParameters& flat, const ParallelConfig& cfg, DType compute,
                           const ParameterUnitLayout& units, std::vector<Comm*> model_parallel,
                           const std::function<bool(const std::string&)>& read_in_compute_dtype,
                           const FlatParameters* frozen)
    : dp_(dp), model_parallel_(std::move(model_parallel)), flat_(flat), cfg_(cfg) {
  TORCH_CHECK(flat.pad_to() % dp.size() == 0, "flat units padded to ", flat.pad_to(), " do not divide among ",
              dp.size(), " ranks");
  TORCH_CHECK(cfg.zero >= 0 && cfg.zero <= 3, "ZeRO stage ", cfg.zero, " does not exist");
  if (cfg.zero == 3) {
    params_ = std::make_unique<ShardedParameters>(dp, flat, units, scalar_type_of(compute), read_in_compute_dtype);
    grads_ = std::make_unique<ShardedGradients>(dp, flat, ShardedGradients::Mode::Transient,
                                                [this](int unit) { params_->release(unit); });
    if (frozen) {
      frozen_params_ = std::make_unique<ShardedParameters>(dp, *frozen, units, scalar_type_of(compute),
                                                           read_in_compute_dtype, /*frozen=*/true);
      both_units_ = std::make_unique<BothUnits>(*params_, *frozen_params_);
    }
  } else if (cfg.zero >= 1) {
    grads_ = std::make_unique<ShardedGradients>(
        dp, flat, cfg.zero == 1 ? ShardedGradients::Mode::InPlace : ShardedGradients::Mode::Transient);
  } else if (dp.size() > 1) {
    buckets_ = std::make_unique<Buckets>();
    auto& b = *buckets_;
    b.elems = std::max<int64_t>(1024, static_cast<int64_t>(cfg.bucket_mb * 1024 * 1024 / 4));
    const int64_t n = flat.numel();
    b.pending_init.assign(static_cast<size_t>((n + b.elems - 1) / b.elems), 0);
    for (const auto& slot : flat.slots()) {
      std::vector<int> touched;
      for (int64_t k = slot.offset / b.elems; k <= (slot.offset + slot.numel - 1) / b.elems; ++k) {
        touched.push_back(static_cast<int>(k));
        ++b.pending_init[static_cast<size_t>(k)];
      }
      b.slot_buckets.push_back(std::move(touched));
    }
    b.armed_units.assign(flat.units().size(), 0);
    b.reset();
    b.hooks = hook_gradient_ready(flat, [this](size_t slot) {
      auto& o = *buckets_;
      std::lock_guard<std::mutex> lock(o.mu);
      if (!o.armed_units[static_cast<size_t>(flat_.slots()[slot].unit)]) return;
      for (const int k : o.slot_buckets[slot]) {
        if (--o.pending[static_cast<size_t>(k)] == 0) {
          o.ready[static_cast<size_t>(k)] = 1;
          o.completed.push_back(k);
        }
      }
      if (!o.order.empty()) o.launch_ready(dp_, flat_.grad());
    });
  }
}

ParameterUnits* DataParallel::parameter_units() {
  if (with_experts_) return with_experts_.get();
  if (both_units_) return both_units_.get();
  return params_.get();
}

void DataParallel::join_experts(std::unique_ptr<DataParallel> experts) {
  experts_ = std::move(experts);
  experts_->mean_over_ = dp_.size();
  ParameterUnits* mine = parameter_units();
  ParameterUnits* theirs = experts_->parameter_units();
  TORCH_CHECK(!mine == !theirs, "the experts' reducer and the rest's shard parameters differently");
  if (mine) with_experts_ = std::make_unique<BothUnits>(*mine, *theirs);
}

torch::Tensor DataParallel::frozen_shard() { return frozen_params_ ? frozen_params_->shard() : torch::Tensor(); }

void DataParallel::begin_backward(bool last, const std::vector<int>& units) {
  if (experts_) experts_->begin_backward(last, units);
  if (grads_) {
    grads_->begin_backward(last, units);
    return;
  }
  if (!buckets_ || !buckets_->enabled) return;
  auto& b = *buckets_;
  std::lock_guard<std::mutex> lock(b.mu);
  std::fill(b.armed_units.begin(), b.armed_units.end(), 0);
  if (!last) return;
  for (const int u : units) b.armed_units.at(static_cast<size_t>(u)) = 1;
  b.armed = true;
}

namespace {
// The squared L2 norm of `pieces` in fp64 on their device: each piece's norm in one
// multi-tensor launch, then squared and summed in one order.
torch::Tensor squared_norm(const std::vector<torch::Tensor>& pieces, const torch::TensorOptions& options) {
  if (pieces.empty()) return torch::zeros({}, options.dtype(torch::kFloat64));
  return torch::stack(at::_foreach_norm(pieces)).to(torch::kFloat64).square().sum();
}
}  // namespace

torch::Tensor DataParallel::squared_norm_of_pieces(int rank) {
  const bool local = cfg_.zero >= 2;
  const torch::Tensor& g = local ? grads_->shard() : flat_.grad();
  std::vector<torch::Tensor> pieces;
  for (const auto& seg : flat_.shard_segments(rank, dp_.size(), local, local))
    if (seg.counted && seg.numel > 0) pieces.push_back(g.narrow(0, seg.grad_offset, seg.numel));
  return squared_norm(pieces, g.options());
}

torch::Tensor DataParallel::model_parallel_sum(torch::Tensor norm2) {
  for (Comm* group : model_parallel_)
    if (group && group->size() > 1) group->all_reduce_sum(norm2, "gradient norm");
  return norm2;
}

torch::Tensor DataParallel::reduce_gradients() {
  auto norm = reduce_own_gradients();
  if (!experts_) return norm;
  torch::NoGradGuard no_grad;
  return (norm.square() + experts_->reduce_own_gradients().square()).sqrt();
}

torch::Tensor DataParallel::reduce_own_gradients() {
  torch::NoGradGuard no_grad;
  const int n_ranks = dp_.size();
  const double inv = 1.0 / static_cast<double>(mean_over_ > 0 ? mean_over_ : n_ranks);
  if (!grads_) {
    auto& g = flat_.grad();
    if (buckets_ && buckets_->armed) {
      auto& b = *buckets_;
      if (b.order.empty()) {
        // First step: agree on the launch order (what this rank saw, checked against all),
        // reducing after backward this once.
        std::vector<int64_t> order(b.completed.begin(), b.completed.end());
        for (int k = 0; k < static_cast<int>(b.pending.size()); ++k)
          if (!b.ready[static_cast<size_t>(k)]) order.push_back(k);
        auto mine = torch::tensor(order, torch::kFloat64);
        auto high = mine.clone(), low = -mine;
        dp_.all_reduce_max(high, "bucket order");
        dp_.all_reduce_max(low, "bucket order");
        if (torch::equal(high, mine) && torch::equal(-low, mine)) {
          b.order.assign(order.begin(), order.end());
          spdlog::info(
              "data parallel: {} of {} gradient buckets now reduce during backward, in the order all ranks "
              "agreed",
              b.completed.size(), b.order.size());
        } else {
          b.enabled = false;
          spdlog::warn("data parallel: ranks completed gradient buckets in different orders; reducing after backward");
        }
        for (int64_t at = 0, k = 0; at < g.numel(); at += b.elems, ++k) {
          auto bucket = g.narrow(0, at, std::min(b.elems, g.numel() - at));
          dp_.all_reduce_sum(bucket, fmt::format("gradient bucket {}", k));
        }
      } else {
        // Later steps: launch what backward left (in the agreed order), then wait for all.
        {
          std::lock_guard<std::mutex> lock(b.mu);
          std::fill(b.ready.begin(), b.ready.end(), 1);
          b.launch_ready(dp_, g);
        }
        for (const int k : b.order) b.works[static_cast<size_t>(k)]->wait();
      }
      std::lock_guard<std::mutex> lock(b.mu);
      std::fill(b.armed_units.begin(), b.armed_units.end(), 0);
      b.reset();
    } else if (buckets_) {
      const int64_t elems = buckets_->elems;
      for (int64_t at = 0, k = 0; at < g.numel(); at += elems, ++k) {
        auto bucket = g.narrow(0, at, std::min(elems, g.numel() - at));
        dp_.all_reduce_sum(bucket, fmt::format("gradient bucket {}", k));
      }
    }
    if (inv != 1.0) g.mul_(inv);
    std::vector<torch::Tensor> parts;
    for (int j = 0; j < n_ranks; ++j) parts.push_back(squared_norm_of_pieces(j));
    return model_parallel_sum(torch::stack(parts).sum()).sqrt();
  }
  const int during_backward = grads_->finish();
  if (frozen_params_) frozen_params_->release_all();  // the last pass's lowest units
  if (!reported_overlap_) {
    reported_overlap_ = true;
    spdlog::info("data parallel: {} of {} gradient units reduce during backward", during_backward,
                 grads_->units_held());
  }
  if (inv != 1.0) scale_gradients(inv);
  const auto mine = squared_norm_of_pieces(dp_.rank());
  auto parts = torch::zeros({n_ranks}, mine.options());
  parts[dp_.rank()].copy_(mine);
  dp_.all_reduce_sum(parts, "gradient norm");
  return model_parallel_sum(parts.sum()).sqrt();
}

void DataParallel::scale_gradients(double factor) {
  torch::NoGradGuard no_grad;
  if (cfg_.zero >= 2) {
    grads_->shard().mul_(factor);
  } else if (cfg_.zero == 1) {
    for (const auto& unit : flat_.units()) {
      const int64_t piece = unit.numel / dp_.size();
      flat_.grad().narrow(0, unit.offset + dp_.rank() * piece, piece).mul_(factor);
    }
  } else {
    flat_.grad().mul_(factor);
  }
}

void DataParallel::zero_grad() {
  if (experts_) experts_->zero_grad();
  torch::NoGradGuard no_grad;
  if (cfg_.zero >= 2)
    grads_->shard().zero_();
  else
    flat_.zero_grad();
}

std::unique_ptr<AdamW> DataParallel::make_optimizer(const OptimConfig& optim, bool offload) {
  const int r = dp_.rank(), n = dp_.size();
  switch (cfg_.zero) {
    case 0:
      return std::make_unique<AdamW>(flat_.data(), flat_.grad(), flat_.segments(), optim, offload);
    case 1:
      return std::make_unique<AdamW>(flat_.data(), flat_.grad(), flat_.shard_segments(r, n, false, false), optim,
                                     offload);
    case 2:
      return std::make_unique<AdamW>(flat_.data(), grads_->shard(), flat_.shard_segments(r, n, false, true), optim,
                                     offload);
    default:
      return std::make_unique<AdamW>(params_->shard(), grads_->shard(), flat_.shard_segments(r, n, true, true), optim,
                                     offload);
  }
}

void DataParallel::gather_parameters() {
  if (experts_) experts_->gather_parameters();
  if (cfg_.zero < 1 || cfg_.zero > 2 || dp_.size() == 1) return;
  torch::NoGradGuard no_grad;
  auto& p = flat_.data();
  std::deque<std::pair<torch::Tensor, std::unique_ptr<PendingCollective>>> inflight;
  int u = 0;
  for (const auto& unit : flat_.units()) {
    const int64_t piece = unit.numel / dp_.size();
    if (piece > 0) {
      auto mine = p.narrow(0, unit.offset + dp_.rank() * piece, piece).clone();
      auto work = dp_.all_gather_async(mine, p.narrow(0, unit.offset, unit.numel), fmt::format("parameters of unit {}", u));
      inflight.emplace_back(std::move(mine), std::move(work));
      if (inflight.size() > 2) {
        inflight.front().second->wait();
        inflight.pop_front();
      }
    }
    ++u;
  }
  for (auto& job : inflight) job.second->wait();
}

void DataParallel::hold_whole(int unit) {
  if (params_) params_->gather_exact(unit);
  if (experts_) experts_->hold_whole(unit);
}

void DataParallel::release_whole(int unit) {
  if (params_) params_->release(unit);
  if (experts_) experts_->release_whole(unit);
}

torch::Tensor DataParallel::sum(const torch::Tensor& x) {
  auto t = x.to(torch::kFloat64).reshape({-1}).clone();
  dp_.all_reduce_sum(t, "loss");
  return t.view(x.sizes());
}

double DataParallel::sum(double x) { return sum(torch::tensor(x, torch::kFloat64)).item<double>(); }

int64_t DataParallel::param_bytes() const {
  const auto numel = params_ ? params_->shard().numel() : flat_.numel();
  const auto frozen = frozen_params_ ? frozen_params_->shard().nbytes() : 0;
  return numel * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(frozen) +
         (experts_ ? experts_->param_bytes() : 0);
}

int64_t DataParallel::grad_bytes() const {
  const auto numel = cfg_.zero >= 2 ? grads_->shard().numel() : flat_.numel();
  return numel * static_cast<int64_t>(sizeof(float)) + (experts_ ? experts_->grad_bytes() : 0);
}

int64_t DataParallel::peak_transient_bytes() const {
  return (params_ ? params_->peak_gathered_bytes() : 0) + (frozen_params_ ? frozen_params_->peak_gathered_bytes() : 0) +
         (grads_ ? grads_->peak_transient_bytes() : 0) + (experts_ ? experts_->peak_transient_bytes() : 0);
}

int64_t DataParallel::bytes_sent() const { return dp_.bytes_sent() + (experts_ ? experts_->bytes_sent() : 0); }

}  // namespace tide
