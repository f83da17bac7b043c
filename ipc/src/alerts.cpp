#include "alerts.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>
#include <httplib.h>
#include <spdlog/spdlog.h>

#include "run_command.h"
#include "tide/engine/io/http_url.h"

namespace tide::ipc {
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {
// A receiver that is down for long loses the oldest alerts, not the controller's memory.
constexpr size_t kQueueLimit = 1000;
// Distinct webhooks of recipes with a courier (and a thread) each, for tided's lifetime.
constexpr size_t kRecipeWebhooks = 64;
constexpr int kAttempts = 4;  // the first, then after 1, 2 and 4 s
constexpr auto kFirstRetry = std::chrono::seconds(1);
constexpr auto kFlushTime = std::chrono::seconds(5);
constexpr int kTimeoutSeconds = 5;  // to connect, and each read or write, of a webhook
constexpr auto kCommandTime = std::chrono::seconds(10);
constexpr size_t kIntervalsKept = 32;
// The first steps of an attempt (start-up, the first batches) say little of its pace.
constexpr size_t kIntervalsNeeded = 3;

std::string host_name() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

struct Delivery {
  std::shared_ptr<const std::string> text;
  std::string what;  // for the log: "stall of llama-tiny-1"
  int attempt = 0;
  Clock::time_point due;
};

// One receiver (a webhook or a command) with its own queue and thread, so that a slow or
// dead one delays no other.
class Courier {
 public:
  Courier(std::string name, std::function<std::string(const std::string&)> send)
      : name_(std::move(name)), send_(std::move(send)), thread_([this] { run(); }) {}
  ~Courier() {
    close();
    thread_.join();
  }
  // Delivers what it holds for kFlushTime more, then ends.
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closing_) return;
      closing_ = true;
      flush_until_ = Clock::now() + kFlushTime;
    }
    wake_.notify_one();
  }
  Courier(const Courier&) = delete;
  Courier& operator=(const Courier&) = delete;

  void post(std::shared_ptr<const std::string> text, std::string what) {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.size() >= kQueueLimit) {
      spdlog::error("alert to {} dropped ({}): {} alerts wait already", name_, queue_.front().what, kQueueLimit);
      queue_.pop_front();
    }
    queue_.push_back({std::move(text), std::move(what), 0, Clock::now()});
    wake_.notify_one();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (closing_ && (queue_.empty() || Clock::now() >= flush_until_)) {
        if (!queue_.empty()) spdlog::error("{} alerts to {} not delivered: tided is stopping", queue_.size(), name_);
        return;
      }
      if (queue_.empty()) {
        wake_.wait(lock);
        continue;
      }
      auto next = std::min_element(queue_.begin(), queue_.end(),
                                   [](const Delivery& a, const Delivery& b) { return a.due < b.due; });
      if (next->due > Clock::now()) {
        wake_.wait_until(lock, closing_ ? std::min(next->due, flush_until_) : next->due);
        continue;
      }
      Delivery d = *next;
      queue_.erase(next);
      lock.unlock();
      const std::string error = send_(*d.text);
      lock.lock();
      if (error.empty()) {
        spdlog::info("alert delivered to {} ({})", name_, d.what);
      } else if (++d.attempt < kAttempts) {
        spdlog::warn("alert to {} ({}) failed, attempt {} of {}: {}", name_, d.what, d.attempt, kAttempts, error);
        d.due = Clock::now() + kFirstRetry * (1 << (d.attempt - 1));
        queue_.push_back(std::move(d));
      } else {
        spdlog::error("alert to {} ({}) not delivered after {} attempts: {}", name_, d.what, kAttempts, error);
      }
    }
  }

  std::string name_;
  std::function<std::string(const std::string&)> send_;  // "" when delivered, else why not
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Delivery> queue_;
  bool closing_ = false;
  Clock::time_point flush_until_;
  std::thread thread_;  // last: started once the rest is ready
};

std::string post_webhook(const HttpUrl& hook, const std::string& text) {
  httplib::Client client(hook.origin);
  client.set_connection_timeout(kTimeoutSeconds, 0);
  client.set_read_timeout(kTimeoutSeconds, 0);
  client.set_write_timeout(kTimeoutSeconds, 0);
  const auto res = client.Post(hook.path, text, "application/json");
  if (!res) return httplib::to_string(res.error());
  if (res->status / 100 != 2) return fmt::format("HTTP {}", res->status);
  return "";
}

std::string run_alert_command(const std::string& command, const std::string& text) {
  const CommandResult result = run_command({"/bin/sh", "-c", command, "tide-alert", text}, kCommandTime);
  return result.ok() ? "" : result.describe({command});
}

// How a run has been stepping, for stalls.
struct Pace {
  bool running = false;
  double last = 0;  // when its latest step (or its start) came
  int64_t step = 0;
  std::deque<double> intervals;
  bool stalled = false;
};

double median(std::deque<double> values) {
  auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}
}  // namespace

struct Alerts::Impl {
  AlertOptions opt;
  std::string host = host_name();
  std::map<std::string, Pace> paces;  // the controller's thread only
  std::vector<std::unique_ptr<Courier>> couriers;
  std::map<std::string, std::unique_ptr<Courier>> recipe_couriers;  // by URL

  // The courier of a recipe's webhook; null when it cannot have one (said in the log).
  Courier* recipe_courier(const std::string& run, const std::string& url) {
    if (auto it = recipe_couriers.find(url); it != recipe_couriers.end()) return it->second.get();
    try {
      const HttpUrl hook = parse_http_url(url, "alert webhook");
      if (recipe_couriers.size() >= kRecipeWebhooks) {
        spdlog::error("run {}: alert webhook {} not used: recipes have named {} others already", run, url,
                      kRecipeWebhooks);
        return nullptr;
      }
      return (recipe_couriers[url] = std::make_unique<Courier>(
                  hook.origin + hook.path, [hook](const std::string& text) { return post_webhook(hook, text); }))
          .get();
    } catch (const std::exception& e) {
      spdlog::error("run {}: {}", run, e.what());
      return nullptr;
    }
  }

  void raise(const std::string& run, const std::string& kind, int64_t step, const std::string& text, const json& detail,
             double now) {
    spdlog::warn("alert ({}): {}", kind, text);
    json message = {{"source", "tide"},
                    {"kind", kind},
                    {"run", run},
                    {"step", step},
                    {"time", now},
                    {"host", host},
                    {"text", text},
                    {"detail", detail},
                    {"dashboard", opt.dashboard_url.empty() ? json(nullptr)
                                                            : json(fmt::format("{}#/run/{}", opt.dashboard_url, run))}};
    auto body = std::make_shared<const std::string>(message.dump(-1, ' ', false, json::error_handler_t::replace));
    for (auto& courier : couriers) courier->post(body, fmt::format("{} of {}", kind, run));
    if (!opt.run_webhooks) return;
    std::vector<std::string> hooks;
    try {
      hooks = opt.run_webhooks(run);
    } catch (const std::exception& e) {
      spdlog::error("run {}: its recipe's alert webhooks cannot be read: {}", run, e.what());
    }
    for (const auto& url : hooks)
      if (Courier* courier = recipe_courier(run, url)) courier->post(body, fmt::format("{} of {}", kind, run));
  }
};

Alerts::Alerts(AlertOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = std::move(options);
  if (!(m.opt.stall_factor >= 1))
    throw std::invalid_argument(fmt::format("alert stall factor {} is below 1", m.opt.stall_factor));
  if (!(m.opt.stall_min_s > 0))
    throw std::invalid_argument(fmt::format("alert stall minimum {} s is not positive", m.opt.stall_min_s));
  for (const auto& url : m.opt.webhooks) {
    const HttpUrl hook = parse_http_url(url, "alert webhook");
    m.couriers.push_back(std::make_unique<Courier>(
        hook.origin + hook.path, [hook](const std::string& text) { return post_webhook(hook, text); }));
  }
  for (const auto& command : m.opt.commands) {
    if (command.empty()) throw std::invalid_argument("an alert command is empty");
    m.couriers.push_back(std::make_unique<Courier>(
        fmt::format("`{}`", command), [command](const std::string& text) { return run_alert_command(command, text); }));
  }
  spdlog::info(
      "alerts go to {} webhook(s) and {} command(s){}; a run is stalled after {}x its median step interval "
      "(at least {} s)",
      m.opt.webhooks.size(), m.opt.commands.size(),
      m.opt.run_webhooks ? ", and to the webhooks runs' recipes name" : "", m.opt.stall_factor, m.opt.stall_min_s);
}

// The couriers flush side by side: kFlushTime in all, not for each.
Alerts::~Alerts() {
  for (auto& courier : impl_->couriers) courier->close();
  for (auto& [url, courier] : impl_->recipe_couriers) courier->close();
}

void Alerts::on_event(const std::string& run, const std::string& kind, const json& body, double now) {
  Impl& m = *impl_;
  if (!body.is_object()) return;
  const int64_t step = body.value("step", int64_t{0});
  if (kind == "metrics") {
    Pace& p = m.paces[run];
    if (p.running && p.last > 0) {
      p.intervals.push_back(now - p.last);
      if (p.intervals.size() > kIntervalsKept) p.intervals.pop_front();
    }
    p.last = now;
    p.step = step;
    if (p.stalled) {
      p.stalled = false;
      m.raise(run, "stall_over", step, fmt::format("run {} steps again (step {})", run, step), json::object(), now);
    }
  } else if (kind == "state") {
    const std::string state = body.value("state", "");
    Pace& p = m.paces[run];
    p.running = state == "running";
    p.last = now;  // a run that (re)starts or resumes is timed from now
    p.stalled = false;
    if (state == "failed")
      m.raise(run, "failed", step, fmt::format("run {} failed: {}", run, body.value("error", "(no reason given)")),
              body, now);
    if (state == "restarting")
      m.raise(run, "fault", step,
              fmt::format("run {} restarts after a fault (restart {}): {}", run, body.value("restarts", int64_t{0}),
                          body.value("reason", "(no reason given)")),
              body, now);
    if (state == "completed" || state == "stopped" || state == "failed" || state == "cancelled") m.paces.erase(run);
  } else if (kind == "anomaly" && body.value("action", "none") != "none") {
    const auto value = body.value("value", json());
    m.raise(run, "anomaly", step,
            fmt::format("run {} step {}: {} (value {}) -> {}", run, step, body.value("kind", "?"),
                        value.is_number() ? fmt::format("{:.6g}", value.get<double>()) : "not finite",
                        body.value("action", "?")),
            body, now);
  } else if (kind == "checkpoint" && !body.value("ok", true)) {
    m.raise(run, "checkpoint_failed", step,
            fmt::format("run {}: the checkpoint of step {} failed: {}", run, step, body.value("error", "?")), body,
            now);
  }
}

void Alerts::tick(double now) {
  Impl& m = *impl_;
  for (auto& [run, p] : m.paces) {
    if (!p.running || p.stalled || p.intervals.size() < kIntervalsNeeded) continue;
    const double typical = median(p.intervals);
    const double limit = std::max(m.opt.stall_factor * typical, m.opt.stall_min_s);
    if (now - p.last <= limit) continue;
    p.stalled = true;
    m.raise(run, "stall", p.step,
            fmt::format("run {} has made no step for {:.0f} s (since step {}; its median step took {:.3g} s)", run,
                        now - p.last, p.step, typical),
            {{"seconds_since_step", now - p.last}, {"median_step_seconds", typical}, {"limit_seconds", limit}}, now);
  }
}

}  // namespace tide::ipc
