#include "controlled_worker.h"

#include <chrono>
#include <mutex>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/base_sink.h>

namespace tide::worker {
namespace {

// The controller answers within its policy budget; this covers a busy controller.
constexpr std::chrono::milliseconds kPolicyWait{10000};

// The run log's lines, as "log" messages to the controller (published as log events).
class LinkSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit LinkSink(ipc::WorkerLink* link) : link_(link) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    link_->send("log", {{"level", spdlog::level::to_string_view(msg.level).data()},
                        {"line", std::string(msg.payload.data(), msg.payload.size())}});
  }
  void flush_() override {}

 private:
  ipc::WorkerLink* link_;
};

}  // namespace

std::unique_ptr<ipc::WorkerLink> attach_controller(TrainHooks& hooks, bool ask_anomaly_policy, int rank) {
  const auto id = ipc::worker_identity_from_environment(rank);
  if (!id) return nullptr;
  auto link = std::make_unique<ipc::WorkerLink>(*id);
  hooks.controlled = true;
  // Every rank takes part in the decision's broadcast; only rank 0 asks.
  if (ask_anomaly_policy) hooks.anomaly_policy = [](const nlohmann::json&) { return nlohmann::json(); };
  ipc::WorkerLink* l = link.get();
  // Every rank: what only it knows of each step (its time, where the time went, its
  // memory), for per-rank views in which a slow rank stands out.
  auto each_rank = hooks.on_step;
  hooks.on_step = [l, each_rank](const StepMetrics& m) {
    l->send("rank", rank_figures(m));
    if (each_rank) each_rank(m);
  };
  if (id->rank != 0) return link;
  if (ask_anomaly_policy)
    hooks.anomaly_policy = [l](const nlohmann::json& anomaly) {
      const auto answer = l->ask("decide", {{"anomaly", anomaly}}, kPolicyWait);
      if (!answer) throw std::runtime_error(fmt::format("no answer from the controller in {} s", kPolicyWait.count() / 1000));
      return *answer;
    };
  hooks.take_commands = [l] { return l->take_commands(); };
  hooks.on_event = [l](const std::string& kind, const nlohmann::json& body) {
    l->send("event", {{"kind", kind}, {"body", body}});
  };
  auto previous = hooks.on_step;
  hooks.on_step = [l, previous](const StepMetrics& m) {
    if (previous) previous(m);  // this rank's own figures of the step reach the controller first
    l->send("metrics", to_json(m));
  };
  auto sink = std::make_shared<LinkSink>(l);
  sink->set_level(spdlog::level::info);
  hooks.log_sinks.push_back(sink);
  return link;
}

void report_result(ipc::WorkerLink* link, const TrainResult& r) {
  if (!link) return;
  nlohmann::json body = {{"steps", r.steps}, {"final_loss", r.final_loss}, {"stopped", r.stopped}};
  if (r.final_val_loss) body["final_val_loss"] = *r.final_val_loss;
  link->send("done", body);
}

void report_failure(ipc::WorkerLink* link, const std::string& message) {
  if (link) link->send("error", {{"message", message}});
}

}  // namespace tide::worker
