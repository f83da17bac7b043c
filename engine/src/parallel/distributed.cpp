#include "tide/engine/parallel/distributed.h"

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
// PyTorch's wheels ship ProcessGroupGloo.hpp but not the gloo headers it includes; any
// gloo release's headers declare what it names (Debian's libgloo-dev here). That is
// sound because tide only calls LibTorch's exported constructors and c10d::Backend's
// virtual functions, and every gloo type inside ProcessGroupGloo sits behind a smart
// pointer, so its size does not depend on gloo's version. tests/tools/
// check_symbol_binding.py fails if any gloo symbol enters a tide binary (docs/building.md).
// Without gloo headers, CPU collectives are unavailable and CUDA runs use NCCL.
#if __has_include(<gloo/algorithm.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#define TIDE_HAVE_GLOO 1
#endif
#ifdef USE_C10D_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "comm_impl.h"
#include "heartbeat.h"
#include "tide/engine/parallel/network_address.h"
#include "tide/engine/parallel/store_client.h"

namespace tide {

struct Distributed::Store {
  c10::intrusive_ptr<c10d::Store> store;
};

namespace {

#ifdef TIDE_HAVE_GLOO
// Where this rank's Gloo pairs listen, which every peer must reach: the interfaces named by
// GLOO_SOCKET_IFNAME (comma-separated, as PyTorch reads it), else the address that faces the
// rendezvous host. Gloo's own default resolves the host name, which on most machines
// (/etc/hosts) names a loopback address that no other host can connect to.
std::vector<std::shared_ptr<::gloo::transport::Device>> gloo_devices(const LaunchEnv& env, const std::string& address) {
  std::vector<std::shared_ptr<::gloo::transport::Device>> out;
  const char* names = std::getenv("GLOO_SOCKET_IFNAME");
  if (names && *names) {
    std::string list = names;
    for (size_t start = 0; start <= list.size();) {
      const size_t end = std::min(list.find(',', start), list.size());
      if (end > start) out.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(list.substr(start, end - start)));
      start = end + 1;
    }
    spdlog::debug("rank {}: Gloo on the interfaces {} (GLOO_SOCKET_IFNAME)", env.rank, list);
    return out;
  }
  spdlog::debug("rank {}: Gloo on {}, the address facing the rendezvous host {}", env.rank, address, env.master_addr);
  out.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(address));
  return out;
}

std::string describe_devices(const std::vector<std::shared_ptr<::gloo::transport::Device>>& devices) {
  std::vector<std::string> names;
  for (const auto& d : devices) names.push_back(d->str());
  return fmt::format("{}", fmt::join(names, ", "));
}
#endif

#ifdef USE_C10D_NCCL
// NCCL refuses two ranks on one GPU only when a collective first builds its communicator
// ("Duplicate GPU detected"), naming no setting. Each rank publishes the UUID of its GPU
// in the rendezvous store and reads every other's first: one GPU seen by several ranks
// (a single visible GPU is each rank's own only where a launcher gives every rank a
// different one) is refused here, with the setting that lets ranks share it.
void refuse_shared_gpus(c10d::Store& store, const LaunchEnv& env) {
  const int device = cuda_device_of_local_rank(env.local_rank, static_cast<int>(c10::cuda::device_count()), false);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess)
    throw std::runtime_error(fmt::format("rank {}: cannot read the properties of cuda:{}", env.rank, device));
  const std::vector<uint8_t> mine(prop.uuid.bytes, prop.uuid.bytes + sizeof(prop.uuid.bytes));
  store.set(fmt::format("tide/gpu/{}", env.rank), mine);
  for (int r = 0; r < env.world; ++r) {
    if (r != env.rank && store.get(fmt::format("tide/gpu/{}", r)) == mine)
      throw std::invalid_argument(
          fmt::format("cuda: ranks {} and {} are on the same GPU (cuda:{} of rank {}), which NCCL refuses; "
                      "parallel.backend = \"gloo\" lets ranks share a GPU",
                      std::min(r, env.rank), std::max(r, env.rank), device, env.rank));
  }
}
#endif

std::unique_ptr<Comm> make_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& name,
                                 const std::vector<int>& ranks, int my_rank, const LaunchEnv& env,
                                 std::chrono::milliseconds timeout, bool nccl, const std::string& address,
                                 const std::shared_ptr<Distributed::Heartbeat>& heartbeat) {
  auto impl = std::make_unique<Comm::Impl>();
  impl->name = name;
  if (heartbeat) {
    impl->progress = heartbeat->progress;
    impl->diagnose = [heartbeat](const std::vector<int>& r) { return heartbeat->describe(r); };
  }
  impl->ranks = ranks;
  impl->timeout = timeout;
  impl->group_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), my_rank) - ranks.begin());
  if (ranks.size() > 1) {
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(name, store);
    const int size = static_cast<int>(ranks.size());
    if (nccl) {
#ifdef USE_C10D_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      impl->pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, impl->group_rank, size, opts);
      impl->gloo = false;
      const int gpus = static_cast<int>(c10::cuda::device_count());
      impl->device = c10::Device(c10::kCUDA,
                                 static_cast<c10::DeviceIndex>(cuda_device_of_local_rank(env.local_rank, gpus, false)));
#else
      throw std::runtime_error(
          "this LibTorch has no NCCL: CUDA ranks need a CUDA build of LibTorch, or parallel.backend = \"gloo\"");
#endif
    } else {
#ifdef TIDE_HAVE_GLOO
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices = gloo_devices(env, address);
      opts->threads = 1;
      try {
        impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, impl->group_rank, size, opts);
      } catch (const c10::Error& e) {
        // Every rank connects to every other at the address each published in the store.
        throw CommError(fmt::format(
            "rank {}: connecting group {} (ranks {}) failed: {} (this rank listens on {}; "
            "GLOO_SOCKET_IFNAME names the interface to use instead)",
            my_rank, name, fmt::join(ranks, ", "), e.what_without_backtrace(), describe_devices(opts->devices)));
      }
#else
      throw std::runtime_error("this LibTorch was built without Gloo headers: CPU collectives are unavailable "
                               "(set device = \"cuda\" to use NCCL)");
#endif
    }
  }
  return std::make_unique<Comm>(std::move(impl));
}

}  // namespace

std::unique_ptr<Distributed> init_distributed(const LaunchEnv& env, const ParallelConfig& parallel,
                                              std::chrono::milliseconds timeout, bool cuda) {
  // Gloo writes to its peers' sockets without MSG_NOSIGNAL: it relies on SIGPIPE being
  // ignored, as CPython ignores it at start-up for every PyTorch job. Here, a peer that
  // dies mid-collective would otherwise kill this rank with SIGPIPE instead of failing
  // the collective with a CommError that names it (seen under load in Comm.DeadPeer*).
  ::signal(SIGPIPE, SIG_IGN);
  Grid grid(env.world, env.rank, static_cast<int>(parallel.dp), static_cast<int>(parallel.tp),
            static_cast<int>(parallel.pp), static_cast<int>(parallel.cp));
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
  // How the peers reach this host (and how they name it when it is lost).
  const std::string address = local_address_toward(env.master_addr);
  auto d = std::make_unique<Distributed>(Distributed{grid, env, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                     nullptr, nullptr, nullptr, nullptr, nullptr, nullptr});
  d->store = std::make_shared<Distributed::Store>(Distributed::Store{store});
  try {
    d->heartbeat = std::make_shared<Distributed::Heartbeat>(
        env, timeout, std::chrono::milliseconds(static_cast<int64_t>(parallel.node_timeout_s * 1000)), address);
  } catch (const std::exception& e) {
    spdlog::warn("rank {}: no heartbeat ({}); a timed-out collective will not name silent peers", env.rank, e.what());
  }
  const auto& hb = d->heartbeat;
  std::vector<int> all(static_cast<size_t>(env.world));
  for (int r = 0; r < env.world; ++r) all[static_cast<size_t>(r)] = r;
  const bool nccl = cuda && parallel.backend != "gloo";
#ifdef USE_C10D_NCCL
  if (nccl) refuse_shared_gpus(*store, env);
#endif
  d->world = make_group(store, "world", all, env.rank, env, timeout, nccl, address, hb);
#ifdef TIDE_HAVE_GLOO
  d->host = make_group(store, "host", all, env.rank, env, timeout, /*nccl=*/false, address, hb);
#else
  if (nccl)
    spdlog::warn(
        "rank {}: this LibTorch has no Gloo: control commands travel through NCCL, and each step boundary "
        "waits for the device",
        env.rank);
#endif
  d->dp = make_group(store, grid.dp_group_name(), grid.dp_group(), env.rank, env, timeout, nccl, address, hb);
  d->tp = make_group(store, grid.tp_group_name(), grid.tp_group(), env.rank, env, timeout, nccl, address, hb);
  d->pp = make_group(store, grid.pp_group_name(), grid.pp_group(), env.rank, env, timeout, nccl, address, hb);
  if (grid.cp() > 1) {
    d->cp = make_group(store, grid.cp_group_name(), grid.cp_group(), env.rank, env, timeout, nccl, address, hb);
    d->dp_cp =
        make_group(store, grid.replica_group_name(), grid.replica_group(), env.rank, env, timeout, nccl, address, hb);
  }
  if (parallel.ep > 1) {
    const int ep = static_cast<int>(parallel.ep);
    d->ep = make_group(store, grid.ep_group_name(ep), grid.ep_group(ep), env.rank, env, timeout, nccl, address, hb);
    d->expert_replicas = make_group(store, grid.expert_replica_group_name(ep), grid.expert_replica_group(ep), env.rank,
                                    env, timeout, nccl, address, hb);
  }
  const auto stages = grid.pp_group();
  const int stage = grid.coords().pp;
  if (stage == 0 || stage == grid.pp() - 1) {
    std::vector<int> ends{stages.front()};
    if (stages.size() > 1) ends.push_back(stages.back());
    d->embedding =
        make_group(store, "embedding." + grid.pp_group_name(), ends, env.rank, env, timeout, nccl, address, hb);
  }
  spdlog::debug("rank {}: {}", env.rank, grid.describe());
  return d;
}

}  // namespace tide
