// The requests of docs/protocol.md, answered from the controller's parts. A submit's
// recipe is evaluated on the evaluator's thread: its reply comes when the evaluation
// ends, and every other request is answered meanwhile.
#pragma once

#include <atomic>
#include <future>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "exports.h"
#include "policy_host.h"
#include "recipe_evaluator.h"
#include "run_book.h"
#include "supervisor.h"
#include "tide/engine/plan/plan.h"
#include "tide/ipc/controller.h"
#include "tide/ipc/protocol.h"

namespace tide::ipc {

// Where a reply goes: the client's routing frames on the command socket, and the id it
// gave its request.
struct ReplyTo {
  std::string identity;
  bool delimited = false;  // a REQ client: an empty frame before the body
  nlohmann::json id;
};

// What `info` tells about the controller's sockets.
struct ServiceInfo {
  std::vector<std::string> command_endpoints, event_endpoints;
  std::optional<std::string> curve_public_key;
  std::string http_url;  // the dashboard's, when it serves one
};

class Requests {
 public:
  Requests(const ControllerOptions& opt, const ServiceInfo& service, RunBook& runs, Supervisor& supervisor,
           PolicyHost& policies, Exports& exports, EventBus& bus, RecipeEvaluator& evaluator,
           std::atomic<bool>& stopping);

  // The reply's body; nothing when it comes later from finished_submits. Throws
  // ProtocolError for an error reply.
  std::optional<nlohmann::json> handle(const Request& req, const ReplyTo& to);
  // The replies (whole reply texts) of submits whose recipes were evaluated, in the order
  // they were submitted; with `wait`, every pending one's.
  std::vector<std::pair<ReplyTo, std::string>> finished_submits(bool wait);
  // A command of a recipe policy's (set, pause, ...), as the request it stands for.
  void apply(RunRecord& r, const nlohmann::json& command, const std::string& request_id);

 private:
  std::optional<nlohmann::json> dispatch(const Request& req, const ReplyTo& to);
  // A submit, or a plan (its recipe is evaluated, then planned, on the evaluator's thread).
  struct PendingSubmit {
    bool plan = false;
    ReplyTo to;
    nlohmann::json body;
    std::string text, source, workdir, key;
    std::vector<std::string> overrides;
    std::shared_future<EvaluatedRecipe> evaluated;
  };
  std::optional<nlohmann::json> begin_submit(const nlohmann::json& body, const ReplyTo& to);
  nlohmann::json finish_submit(const PendingSubmit& s);
  std::optional<nlohmann::json> begin_plan(const nlohmann::json& body, const ReplyTo& to);
  // Posts the request's recipe (and what follows it) to the evaluator; its reply waits in
  // submits_, in order.
  void evaluate(PendingSubmit s, RecipeEvaluator::FollowUp follow_up = {});
  // This machine's CPU shared by `ranks` workers: the stored calibration (tide plan
  // --calibrate), or nominal per-core figures.
  DeviceSpec local_cpu(int ranks) const;
  // parallel.auto for a run of `workers` CPU ranks on this daemon's machine.
  LayoutChoice auto_layout(const RunConfig& cfg, int workers) const;
  nlohmann::json control(const std::string& op, const nlohmann::json& body, const nlohmann::json& request_id);
  nlohmann::json set(const nlohmann::json& body, const nlohmann::json& request_id);
  nlohmann::json list(const nlohmann::json& body);
  nlohmann::json metrics(const nlohmann::json& body);
  nlohmann::json logs(const nlohmann::json& body);
  nlohmann::json recipe(const nlohmann::json& body);
  nlohmann::json status_of(const RunRecord& r);
  nlohmann::json info();

  const ControllerOptions& opt_;
  const ServiceInfo& service_;
  RunBook& runs_;
  Supervisor& supervisor_;
  PolicyHost& policies_;
  Exports& exports_;
  EventBus& bus_;
  RecipeEvaluator& evaluator_;
  std::atomic<bool>& stopping_;
  std::vector<PendingSubmit> submits_;  // in the order they came
  std::map<std::string, int64_t> counts_;  // requests handled, by type
};

}  // namespace tide::ipc
