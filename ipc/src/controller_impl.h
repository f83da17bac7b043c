// The controller in parts, each with its own state: the event bus (event socket), the
// run book (registry, resolved recipes, state changes), the policy host (recipe
// policies), the supervisor (worker groups), exports, and the requests that use them.
// Impl owns the command socket, its security and the loop (controller.cpp).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <zmq.hpp>

#include "alerts.h"
#include "event_bus.h"
#include "exports.h"
#include "http_server.h"
#include "policy_host.h"
#include "recipe_evaluator.h"
#include "requests.h"
#include "run_book.h"
#include "supervisor.h"
#include "tide/ipc/controller.h"
#include "tide/ipc/curve.h"
#include "wakeup.h"

namespace tide::ipc {

struct Controller::Impl {
  ControllerOptions opt;
  zmq::context_t ctx{1};
  zmq::socket_t commands{ctx, zmq::socket_type::router};
  zmq::socket_t zap{ctx, zmq::socket_type::rep};  // ZAP handler: CURVE clients by key
  std::optional<CurveKeyPair> curve;
  bool zap_bound = false;  // with a CURVE key, or a TCP worker socket (runs under Slurm)
  std::map<std::string, Role> allowed;
  ServiceInfo service;
  std::atomic<bool> stopping{false};
  std::atomic<bool> hurry{false};  // stop without waiting for the runs' checkpoints
  int state_lock = -1;  // flock on <state>/controller.lock, held for the controller's life

  Wakeup wake{"the controller's loop"};  // outlives the evaluator, which writes to it from its thread
  // Destroyed in reverse, before ctx (their sockets close first): requests first, the
  // evaluator (which joins its thread) last.
  std::unique_ptr<RecipeEvaluator> evaluator;
  std::unique_ptr<EventBus> bus;
  std::unique_ptr<Alerts> alerts;  // observes bus; flushed at the end of shutdown
  std::unique_ptr<RunBook> runs;
  std::unique_ptr<PolicyHost> policies;
  std::unique_ptr<Supervisor> supervisor;
  std::unique_ptr<Exports> exports;
  std::unique_ptr<Requests> requests;
  std::unique_ptr<HttpServer> http;  // a client of the command socket: stopped first

  explicit Impl(ControllerOptions o);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  void bind_endpoints();
  void serve_zap();
  void serve_commands();
  void send_reply(const ReplyTo& to, const std::string& text);
  void reply_to_finished_submits(bool wait);
  void tick();
  void shutdown();
};

}  // namespace tide::ipc
