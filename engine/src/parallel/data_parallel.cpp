#include "tide/engine/parallel/data_parallel.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/parallel/comm.h"

namespace tide {

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
}

void DataParallel::average_gradients() {
  torch::NoGradGuard no_grad;
  auto& g = flat_.grad();
  const int64_t n = g.numel();
  int bucket = 0;
  for (int64_t at = 0; at < n; at += bucket_elems_, ++bucket) {
    auto slice = g.narrow(0, at, std::min(bucket_elems_, n - at));
    dp_.all_reduce_sum(slice, fmt::format("gradient bucket {}", bucket));
  }
  if (dp_.size() > 1) g.div_(static_cast<double>(dp_.size()));
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
