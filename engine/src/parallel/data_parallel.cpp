#include "tide/engine/parallel/data_parallel.h"

#include <cmath>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/parallel/comm.h"

namespace tide {

struct DataParallel::Overlap {
  std::vector<std::vector<int>> slot_buckets;  // buckets each parameter slot touches
  std::vector<int> pending_init, pending;      // slots still to deliver, per bucket
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keeps the hooks alive
  std::vector<int> order;                      // agreed launch order; empty until then
  std::vector<int> completed;                  // completion order in this backward
  std::vector<char> ready, launched;
  size_t next = 0;                             // position in `order`
  std::vector<std::unique_ptr<PendingCollective>> works;
  bool armed = false, enabled = true;
  std::mutex mu;
};

namespace {
struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(DataParallel* o, size_t s) : owner(o), slot(s) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    owner->on_gradient_ready(slot);
    return outputs;
  }
  DataParallel* owner;
  size_t slot;
};
}  // namespace

DataParallel::~DataParallel() = default;

DataParallel::DataParallel(Comm& dp, FlatParameters& flat, const ParallelConfig& cfg)
    : dp_(dp), flat_(flat), cfg_(cfg) {
  bucket_elems_ = std::max<int64_t>(1024, static_cast<int64_t>(cfg.bucket_mb * 1024 * 1024 / 4));
  const int64_t n = flat.numel();
  TORCH_CHECK(n % dp.size() == 0, "flat buffer of ", n, " elements is not padded to the ", dp.size(), " ranks");
  if (cfg.zero >= 1) {
    const int64_t shard = n / dp.size();
    begin_ = shard * dp.rank();
    end_ = begin_ + shard;
  } else {
    begin_ = 0;
    end_ = n;
  }
  if (cfg.zero == 0 && dp.size() > 1) {
    overlap_ = std::make_unique<Overlap>();
    auto& o = *overlap_;
    const int64_t buckets = (n + bucket_elems_ - 1) / bucket_elems_;
    o.pending_init.assign(static_cast<size_t>(buckets), 0);
    for (size_t i = 0; i < flat.slots().size(); ++i) {
      const auto& slot = flat.slots()[i];
      std::vector<int> touched;
      for (int64_t b = slot.offset / bucket_elems_; b <= (slot.offset + slot.numel - 1) / bucket_elems_; ++b) {
        touched.push_back(static_cast<int>(b));
        ++o.pending_init[static_cast<size_t>(b)];
      }
      o.slot_buckets.push_back(std::move(touched));
      auto acc = torch::autograd::impl::grad_accumulator(slot.param);
      acc->add_post_hook(std::make_unique<ReadyHook>(this, i));
      o.accumulators.push_back(std::move(acc));
    }
  }
}

bool DataParallel::overlapping() const { return overlap_ && overlap_->enabled && !overlap_->order.empty(); }

void DataParallel::begin_final_backward() {
  if (!overlap_ || !overlap_->enabled) return;
  auto& o = *overlap_;
  std::lock_guard<std::mutex> lock(o.mu);
  o.pending = o.pending_init;
  o.ready.assign(o.pending.size(), 0);
  o.launched.assign(o.pending.size(), 0);
  o.works.clear();
  o.works.resize(o.pending.size());
  o.completed.clear();
  o.next = 0;
  o.armed = true;
}

void DataParallel::on_gradient_ready(size_t slot) {
  auto& o = *overlap_;
  std::lock_guard<std::mutex> lock(o.mu);
  if (!o.armed) return;
  for (const int b : o.slot_buckets[slot]) {
    if (--o.pending[static_cast<size_t>(b)] == 0) {
      o.ready[static_cast<size_t>(b)] = 1;
      o.completed.push_back(b);
    }
  }
  if (!o.order.empty()) launch_ready();
}

void DataParallel::launch_ready() {
  auto& o = *overlap_;
  auto& g = flat_.grad();
  while (o.next < o.order.size() && o.ready[static_cast<size_t>(o.order[o.next])]) {
    const int b = o.order[o.next++];
    const int64_t at = b * bucket_elems_;
    o.works[static_cast<size_t>(b)] =
        dp_.all_reduce_sum_async(g.narrow(0, at, std::min(bucket_elems_, g.numel() - at)),
                                 fmt::format("gradient bucket {}", b));
    o.launched[static_cast<size_t>(b)] = 1;
  }
}

double DataParallel::reduce_gradients() {
  torch::NoGradGuard no_grad;
  auto& g = flat_.grad();
  const int n_ranks = dp_.size();
  const int64_t shard = g.numel() / n_ranks;
  const double inv = 1.0 / static_cast<double>(n_ranks);
  auto squared_norm = [](const torch::Tensor& t) {
    const double x = t.norm().item<double>();
    return x * x;
  };
  double norm2 = 0;
  if (overlap_ && overlap_->armed && overlap_->order.empty()) {
    // First step: agree on the launch order (what this rank saw, checked against all).
    auto& o = *overlap_;
    std::vector<int64_t> order(o.completed.begin(), o.completed.end());
    for (int b = 0; b < static_cast<int>(o.pending.size()); ++b)
      if (!o.ready[static_cast<size_t>(b)]) order.push_back(b);
    auto mine = torch::tensor(order, torch::kFloat64);
    auto high = mine.clone(), low = -mine;
    dp_.all_reduce_max(high, "bucket order");
    dp_.all_reduce_max(low, "bucket order");
    if (torch::equal(high, mine) && torch::equal(-low, mine)) {
      o.order.assign(order.begin(), order.end());
      spdlog::info("data parallel: {} gradient buckets now reduce during backward, in the order all ranks agreed",
                   o.order.size());
    } else {
      o.enabled = false;
      spdlog::warn("data parallel: ranks completed gradient buckets in different orders; reducing after backward");
    }
    o.armed = false;
  }
  if (cfg_.zero < 1) {
    if (overlap_ && overlap_->armed) {
      // Later steps: launch what backward left (in the agreed order), then wait for all.
      auto& o = *overlap_;
      {
        std::lock_guard<std::mutex> lock(o.mu);
        o.armed = false;
        std::fill(o.ready.begin(), o.ready.end(), 1);
        launch_ready();
      }
      for (const int b : o.order) o.works[static_cast<size_t>(b)]->wait();
    } else {
      int bucket = 0;
      for (int64_t at = 0; at < g.numel(); at += bucket_elems_, ++bucket) {
        auto slice = g.narrow(0, at, std::min(bucket_elems_, g.numel() - at));
        dp_.all_reduce_sum(slice, fmt::format("gradient bucket {}", bucket));
      }
    }
    if (n_ranks > 1) g.mul_(inv);
    for (int j = 0; j < n_ranks; ++j) norm2 += squared_norm(g.narrow(0, j * shard, shard));
  } else {
    // Bucket k holds the k-th piece of every rank's slice: [ranks, piece] gathered
    // into one contiguous input, reduce-scattered so each rank gets its own piece.
    const auto by_rank = g.view({n_ranks, shard});
    auto mine = g.narrow(0, begin_, shard);
    const int64_t piece = std::max<int64_t>(1, bucket_elems_ / n_ranks);
    int bucket = 0;
    for (int64_t at = 0; at < shard; at += piece, ++bucket) {
      const int64_t len = std::min(piece, shard - at);
      auto out = mine.narrow(0, at, len);
      dp_.reduce_scatter_sum(by_rank.narrow(1, at, len).contiguous().view({-1}), out,
                             fmt::format("gradient bucket {}", bucket));
    }
    if (n_ranks > 1) mine.mul_(inv);
    auto parts = torch::zeros({n_ranks}, torch::kFloat64);
    parts[dp_.rank()] = squared_norm(mine);
    dp_.all_reduce_sum(parts, "gradient norm");
    for (int j = 0; j < n_ranks; ++j) norm2 += parts[j].item<double>();
  }
  return std::sqrt(norm2);
}

void DataParallel::scale_gradients(double factor) {
  torch::NoGradGuard no_grad;
  flat_.grad().narrow(0, begin_, end_ - begin_).mul_(factor);
}

double DataParallel::sum(double x) {
  auto t = torch::tensor({x}, torch::kFloat64);
  dp_.all_reduce_sum(t, "loss");
  return t.item<double>();
}

void DataParallel::gather_parameters() {
  if (cfg_.zero < 1 || dp_.size() == 1) return;
  torch::NoGradGuard no_grad;
  auto& p = flat_.data();
  const auto mine = p.narrow(0, begin_, end_ - begin_).clone();
  dp_.all_gather(mine, p, "parameter shards");
}

int64_t DataParallel::bytes_sent() const { return dp_.bytes_sent(); }

}  // namespace tide
