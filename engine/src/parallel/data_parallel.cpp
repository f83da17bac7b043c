#include "tide/engine/parallel/data_parallel.h"

#include <cmath>

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
  if (cfg_.zero < 1) {
    int bucket = 0;
    for (int64_t at = 0; at < g.numel(); at += bucket_elems_, ++bucket) {
      auto slice = g.narrow(0, at, std::min(bucket_elems_, g.numel() - at));
      dp_.all_reduce_sum(slice, fmt::format("gradient bucket {}", bucket));
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
