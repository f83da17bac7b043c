#include "tide/engine/parallel/distributed.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "comm_impl.h"

namespace tide {

struct Distributed::Store {
  c10::intrusive_ptr<c10d::Store> store;
};

namespace {

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

std::unique_ptr<Comm> make_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& name,
                                 const std::vector<int>& ranks, int my_rank, const LaunchEnv& env,
                                 std::chrono::milliseconds timeout, bool cuda) {
  auto impl = std::make_unique<Comm::Impl>();
  impl->name = name;
  impl->ranks = ranks;
  impl->timeout = timeout;
  impl->group_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), my_rank) - ranks.begin());
  if (ranks.size() > 1) {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name, store);
    const int size = static_cast<int>(ranks.size());
    if (cuda) {
#ifdef USE_C10D_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      impl->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, impl->group_rank, size, opts);
      impl->gloo = false;
#else
      throw std::runtime_error("this LibTorch has no NCCL: CUDA training needs a CUDA build of LibTorch");
#endif
    } else {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices.push_back(is_loopback(env.master_addr)
                                  ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                  : c10d::ProcessGroupGloo::createDefaultDevice());
      opts->threads = 1;
      impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, impl->group_rank, size, opts);
    }
  }
  return std::make_unique<Comm>(std::move(impl));
}

}  // namespace

std::unique_ptr<Distributed> init_distributed(const LaunchEnv& env, const ParallelConfig& parallel,
                                              std::chrono::milliseconds timeout, bool cuda) {
  Grid grid(env.world, env.rank, static_cast<int>(parallel.dp), static_cast<int>(parallel.tp),
            static_cast<int>(parallel.pp));
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(env.master_port);
  opts.isServer = env.rank == 0;
  opts.numWorkers = static_cast<size_t>(env.world);
  opts.waitWorkers = true;
  opts.timeout = timeout;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: rendezvous at {}:{} with {} ranks failed: {}", env.rank, env.master_addr,
                                env.master_port, env.world, e.what()));
  }
  auto d = std::make_unique<Distributed>(Distributed{grid, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr});
  d->store = std::make_shared<Distributed::Store>(Distributed::Store{store});
  std::vector<int> all(static_cast<size_t>(env.world));
  for (int r = 0; r < env.world; ++r) all[static_cast<size_t>(r)] = r;
  d->world = make_group(store, "world", all, env.rank, env, timeout, cuda);
  d->dp = make_group(store, grid.dp_group_name(), grid.dp_group(), env.rank, env, timeout, cuda);
  d->tp = make_group(store, grid.tp_group_name(), grid.tp_group(), env.rank, env, timeout, cuda);
  d->pp = make_group(store, grid.pp_group_name(), grid.pp_group(), env.rank, env, timeout, cuda);
  const auto stages = grid.pp_group();
  const int stage = grid.coords().pp;
  if (stage == 0 || stage == grid.pp() - 1) {
    std::vector<int> ends{stages.front()};
    if (stages.size() > 1) ends.push_back(stages.back());
    d->embedding = make_group(store, "embedding." + grid.pp_group_name(), ends, env.rank, env, timeout, cuda);
  }
  spdlog::debug("rank {}: {}", env.rank, grid.describe());
  return d;
}

}  // namespace tide
