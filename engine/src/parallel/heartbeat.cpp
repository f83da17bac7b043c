#include "heartbeat.h"

#include <cstdlib>
#include <optional>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace tide {

namespace {
using Clock = std::chrono::steady_clock;
constexpr auto kBeat = std::chrono::seconds(1);
constexpr int kWatchAllUpTo = 64;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}
std::string key(int r) { return fmt::format("tide/heartbeat/{}", r); }

// A published pulse: "<ms>\n<completed>\n<waiting>\n<host>".
struct Fields {
  int64_t ms = 0;
  std::string completed, waiting, host;
};
Fields parse(const std::string& v) {
  Fields f;
  const auto a = v.find('\n'), b = v.find('\n', a + 1), c = v.find('\n', b + 1);
  if (c == std::string::npos) return f;
  f.ms = std::strtoll(v.substr(0, a).c_str(), nullptr, 10);
  f.completed = v.substr(a + 1, b - a - 1);
  f.waiting = v.substr(b + 1, c - b - 1);
  f.host = v.substr(c + 1);
  return f;
}

// "host H (rank 1 silent for 3 s after 20 collectives, rank 3 ...)" per host.
std::string by_host(const std::vector<std::pair<std::string, std::string>>& host_and_rank_text) {
  std::vector<std::string> hosts;
  std::map<std::string, std::vector<std::string>> of;
  for (const auto& [h, text] : host_and_rank_text) {
    if (!of.count(h)) hosts.push_back(h);
    of[h].push_back(text);
  }
  std::vector<std::string> parts;
  for (const auto& h : hosts) parts.push_back(fmt::format("host {} ({})", h, fmt::join(of[h], ", ")));
  return fmt::format("{}", fmt::join(parts, "; "));
}
}  // namespace

Distributed::Heartbeat::Heartbeat(const LaunchEnv& env, std::chrono::milliseconds timeout,
                                  std::chrono::milliseconds node_timeout, std::string host)
    : env_(env),
      // Bounds connecting and waiting; a reply that never comes over a dead link is bounded
      // by the judge (node_timeout) instead.
      timeout_(std::min(timeout, std::chrono::milliseconds(5000))),
      node_timeout_(node_timeout),
      host_(std::move(host)),
      store_(env, timeout_) {
  if (node_timeout_.count() > 0) {
    std::set<int> w;
    if (env.world <= kWatchAllUpTo) {
      for (int r = 0; r < env.world; ++r) w.insert(r);
    } else {
      w = {0, (env.rank + 1) % env.world, (env.rank + env.world - 1) % env.world};
    }
    w.erase(env.rank);
    watched_.assign(w.begin(), w.end());
  }
  const auto start = Clock::now();
  for (const int r : watched_) pulses_[r] = Pulse{"", start};
  store_reached_ = start;
  thread_ = std::thread([this] { run(); });
  if (!watched_.empty()) judge_ = std::thread([this] { judge(); });
}

Distributed::Heartbeat::~Heartbeat() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();  // the judge still runs meanwhile: a store blocked for good ends the rank
  if (judge_.joinable()) judge_.join();
}

void Distributed::Heartbeat::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    std::string waiting;
    {
      std::lock_guard<std::mutex> p(progress->mu);
      waiting = progress->waiting;
    }
    std::map<int, std::optional<std::string>> seen;
    bool reached = false;
    try {
      store_.set(key(env_.rank), fmt::format("{}\n{}\n{}\n{}", now_ms(), progress->completed.load(), waiting, host_));
      for (const int r : watched_) seen[r] = store_.get_if_set(key(r));
      reached = true;
    } catch (const std::exception&) {
      // Rank 0's store is out of reach: the end of the job, or its host lost (judge()).
    }
    lock.lock();
    const auto now = Clock::now();
    if (reached) store_reached_ = now;
    for (const auto& [r, v] : seen) {
      Pulse& p = pulses_[r];
      if (v && *v != p.value) p = Pulse{*v, now};
    }
    cv_.wait_for(lock, kBeat, [this] { return stopping_; });
  }
}

void Distributed::Heartbeat::judge() {
  const double seconds = static_cast<double>(node_timeout_.count()) / 1000.0;
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, kBeat, [this] { return stopping_; })) {
    const auto now = Clock::now();
    if (now - store_reached_ > node_timeout_) {
      spdlog::error(
          "rank {}: lost host {} (rank 0's, which holds the rendezvous store): unreachable for {:.0f} s "
          "(parallel.node_timeout_s); ending this rank",
          env_.rank, env_.master_addr, seconds);
      spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
      std::_Exit(kPeerLostExitStatus);
    }
    std::vector<int> silent;
    for (const int r : watched_)
      if (now - pulses_[r].change > node_timeout_) silent.push_back(r);
    if (!silent.empty()) lost(silent, seconds);
  }
}

std::string Distributed::Heartbeat::host_of(int r) {
  const Fields f = parse(pulses_[r].value);
  if (!f.host.empty()) return f.host;
  // Rank 0 holds the rendezvous store, so its host is the one every rank dialled, pulse or
  // not (a host lost before this rank read its first pulse).
  return r == 0 ? env_.master_addr : "unknown (never reported)";
}

void Distributed::Heartbeat::lost(const std::vector<int>& silent, double seconds) {
  std::vector<std::pair<std::string, std::string>> parts;
  for (const int r : silent) parts.emplace_back(host_of(r), fmt::format("rank {}", r));
  spdlog::error(
      "rank {}: lost {}: no heartbeat for {:.0f} s (parallel.node_timeout_s); ending this rank: resume "
      "from the newest checkpoint with --resume auto",
      env_.rank, by_host(parts), seconds);
  spdlog::apply_all([](const std::shared_ptr<spdlog::logger>& l) { l->flush(); });
  std::_Exit(kPeerLostExitStatus);
}

std::string Distributed::Heartbeat::describe(const std::vector<int>& ranks) {
  std::vector<int> others;
  for (const int r : ranks)
    if (r != env_.rank) others.push_back(r);
  if (others.empty()) return {};
  try {
    StoreClient store(env_, timeout_);  // the heartbeat thread keeps its own
    const auto read = [&] {
      std::map<int, std::optional<std::string>> v;
      for (const int r : others) v[r] = store.get_if_set(key(r));
      return v;
    };
    const auto first = read();
    std::this_thread::sleep_for(kBeat * 5 / 2);
    const auto second = read();
    std::vector<std::string> alive;
    std::vector<std::pair<std::string, std::string>> silent;
    for (const int r : others) {
      const auto& v = second.at(r);
      if (!v) {
        silent.emplace_back("unknown", fmt::format("rank {} never reported", r));
        continue;
      }
      const Fields f = parse(*v);
      if (first.at(r) == v) {
        const double age = static_cast<double>(now_ms() - f.ms) / 1000.0;
        silent.emplace_back(f.host,
                            fmt::format("rank {} silent for {:.0f} s after {} collectives", r, age, f.completed));
      } else if (f.waiting.empty()) {
        alive.push_back(
            fmt::format("rank {} alive after {} collectives but in none (computing, or stuck outside "
                        "communication)",
                        r, f.completed));
      } else {
        alive.push_back(fmt::format("rank {} alive, waiting in {}", r, f.waiting));
      }
    }
    std::vector<std::string> parts;
    if (!silent.empty()) parts.push_back("stopped, killed or unreachable: " + by_host(silent));
    parts.insert(parts.end(), alive.begin(), alive.end());
    return fmt::format("{}", fmt::join(parts, "; "));
  } catch (const std::exception& e) {
    return fmt::format("the rendezvous store on host {} (rank 0's) is unreachable, that host lost or stopped ({})",
                       env_.master_addr, e.what());
  }
}

}  // namespace tide
