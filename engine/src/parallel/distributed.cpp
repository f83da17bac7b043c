#include "tide/engine/parallel/distributed.h"

#include <condition_variable>
#include <csignal>
#include <mutex>
#include <thread>

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
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include "comm_impl.h"
#include "tide/engine/parallel/store_client.h"

namespace tide {

struct Distributed::Store {
  c10::intrusive_ptr<c10d::Store> store;
};

struct Distributed::Heartbeat {
  // A diagnosis must not hang: every store operation gives up after 5 s.
  Heartbeat(const LaunchEnv& env, std::chrono::milliseconds timeout)
      : rank(env.rank), store(env, std::min(timeout, std::chrono::milliseconds(5000))) {
    thread = std::thread([this] { run(); });
  }
  ~Heartbeat() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    thread.join();
  }

  static int64_t now_ms() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  static std::string key(int r) { return fmt::format("tide/heartbeat/{}", r); }

  void run() {
    std::unique_lock<std::mutex> lock(mu);
    while (!stopping) {
      std::string waiting;
      {
        std::lock_guard<std::mutex> p(progress->mu);
        waiting = progress->waiting;
      }
      try {
        store.set(key(rank), fmt::format("{}\n{}\n{}", now_ms(), progress->completed.load(), waiting));
      } catch (const std::exception&) {
        return;  // the store is gone (rank 0 ended): nobody is listening
      }
      cv.wait_for(lock, std::chrono::seconds(1), [this] { return stopping; });
    }
  }

  std::string describe(const std::vector<int>& ranks) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::string> parts;
    for (const int r : ranks) {
      if (r == rank) continue;
      try {
        const auto v = store.get_if_set(key(r));
        if (!v) {
          parts.push_back(fmt::format("rank {} never reported", r));
          continue;
        }
        const auto a = v->find('\n'), b = v->find('\n', a + 1);
        const double age = static_cast<double>(now_ms() - std::stoll(v->substr(0, a))) / 1000.0;
        const std::string done = v->substr(a + 1, b - a - 1), waiting = v->substr(b + 1);
        if (age > 5.0)
          parts.push_back(fmt::format("rank {} silent for {:.0f} s after {} collectives (stopped, killed or "
                                      "unreachable)",
                                      r, age, done));
        else if (waiting.empty())
          parts.push_back(fmt::format("rank {} alive after {} collectives but in none (computing, or stuck outside "
                                      "communication)",
                                      r, done));
        else
          parts.push_back(fmt::format("rank {} alive, waiting in {}", r, waiting));
      } catch (const std::exception& e) {
        parts.push_back(fmt::format("rank {} unknown (rendezvous store unreachable: {})", r, e.what()));
      }
    }
    return fmt::format("{}", fmt::join(parts, "; "));
  }

  int rank;
  std::shared_ptr<CommProgress> progress = std::make_shared<CommProgress>();
  StoreClient store;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::thread thread;
};

namespace {

bool is_loopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0; }

std::unique_ptr<Comm> make_group(const c10::intrusive_ptr<c10d::Store>& store, const std::string& name,
                                 const std::vector<int>& ranks, int my_rank, const LaunchEnv& env,
                                 std::chrono::milliseconds timeout, bool nccl,
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
      impl->device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
#else
      throw std::runtime_error(
          "this LibTorch has no NCCL: CUDA ranks need a CUDA build of LibTorch, or parallel.backend = \"gloo\"");
#endif
    } else {
#ifdef TIDE_HAVE_GLOO
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      opts->devices.push_back(is_loopback(env.master_addr)
                                  ? c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1")
                                  : c10d::ProcessGroupGloo::createDefaultDevice());
      opts->threads = 1;
      impl->pg = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, impl->group_rank, size, opts);
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
  auto d = std::make_unique<Distributed>(Distributed{grid, env, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr});
  d->store = std::make_shared<Distributed::Store>(Distributed::Store{store});
  try {
    d->heartbeat = std::make_shared<Distributed::Heartbeat>(env, timeout);
  } catch (const std::exception& e) {
    spdlog::warn("rank {}: no heartbeat ({}); a timed-out collective will not name silent peers", env.rank, e.what());
  }
  const auto& hb = d->heartbeat;
  std::vector<int> all(static_cast<size_t>(env.world));
  for (int r = 0; r < env.world; ++r) all[static_cast<size_t>(r)] = r;
  const bool nccl = cuda && parallel.backend != "gloo";
  d->world = make_group(store, "world", all, env.rank, env, timeout, nccl, hb);
  d->dp = make_group(store, grid.dp_group_name(), grid.dp_group(), env.rank, env, timeout, nccl, hb);
  d->tp = make_group(store, grid.tp_group_name(), grid.tp_group(), env.rank, env, timeout, nccl, hb);
  d->pp = make_group(store, grid.pp_group_name(), grid.pp_group(), env.rank, env, timeout, nccl, hb);
  const auto stages = grid.pp_group();
  const int stage = grid.coords().pp;
  if (stage == 0 || stage == grid.pp() - 1) {
    std::vector<int> ends{stages.front()};
    if (stages.size() > 1) ends.push_back(stages.back());
    d->embedding = make_group(store, "embedding." + grid.pp_group_name(), ends, env.rank, env, timeout, nccl, hb);
  }
  spdlog::debug("rank {}: {}", env.rank, grid.describe());
  return d;
}

}  // namespace tide
