// Frames on a real controller's sockets, in order (up to four, as the parts of one
// input). A part is a command frame, or `worker IDENTITY` and a line break before a frame
// that a worker with that routing id (run:attempt:rank) sends on the worker socket.
// Each command is answered, no answer is an `internal` error (a handler that failed on
// what it was given instead of refusing it), the controller's loop logs no failure of
// its own, and it still answers `info` after them. A fresh controller and state
// directory for each input, so that a finding reproduces from its file alone. Workers
// are a script that sleeps: a submitted run stays active, with workers to talk to, until
// the controller ends it.
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "fuzz_check.h"
#include "fuzz_input.h"
#include "tide/ipc/controller.h"

namespace {
using json = nlohmann::json;
constexpr size_t kMostFrames = 4;

std::vector<std::string_view> frames_of(const uint8_t* data, size_t size) {
  std::vector<std::string_view> frames;
  for (const auto part : tide::fuzz::split_parts(data, size, kMostFrames)) {
    if (!frames.empty() && part.empty()) break;  // fewer separators than kMostFrames - 1
    frames.push_back(part);
  }
  return frames;
}

// The reply to the frame just sent; nothing once the controller has stopped (a
// `shutdown` frame stops it: what follows is unanswered). libFuzzer's -timeout reports
// a frame that is never answered.
std::optional<std::string> reply_to(zmq::socket_t& client, const std::atomic<bool>& stopped) {
  while (true) {
    zmq::pollitem_t item{client.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;  // SIGCHLD from the controller's workers
      continue;
    }
    if (item.revents & ZMQ_POLLIN) {
      zmq::message_t reply;
      (void)client.recv(reply);
      return reply.to_string();
    }
    if (stopped) return std::nullopt;
  }
}

// Whether the reply accepted a shutdown.
bool check_reply(const std::string& reply, std::string_view frame) {
  static const bool show = std::getenv("TIDE_FUZZ_SHOW") != nullptr;  // to read a finding's conversation
  if (show) std::fprintf(stderr, "> %.*s\n< %s\n", static_cast<int>(frame.size()), frame.data(), reply.c_str());
  json parsed;
  try {
    parsed = json::parse(reply);
  } catch (const json::exception& e) {
    tide::fuzz::fault(std::string("a reply is not JSON (") + e.what() + "): " + reply);
  }
  if (!parsed.is_object() || !parsed.contains("ok") || !parsed["ok"].is_boolean())
    tide::fuzz::fault("a reply without its boolean \"ok\": " + reply);
  if (parsed["ok"].get<bool>()) return parsed.contains("body") && parsed["body"].contains("stopping");
  const json& error = parsed.value("error", json());
  if (!error.is_object() || !error.contains("code") || !error["code"].is_string())
    tide::fuzz::fault("an error reply without its code: " + reply);
  if (error["code"] == "internal")
    tide::fuzz::fault("the frame " + std::string(frame.substr(0, 400)) + " failed inside the controller: " + reply);
  return false;
}
}  // namespace

// The controller's loop logs an error starting "controller: " when a handler failed
// with an exception it did not turn into a reply or a warning.
class LoopFailures : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    const std::string_view text(msg.payload.data(), msg.payload.size());
    if (msg.level >= spdlog::level::err && text.rfind("controller: ", 0) == 0)
      tide::fuzz::fault("the controller's loop failed: " + std::string(text));
  }
  void flush_() override {}
};

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Only errors are looked at: a refused request is a warning each time.
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("fuzz", std::make_shared<LoopFailures>()));
  spdlog::set_level(spdlog::level::err);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace fs = std::filesystem;
  using namespace tide;
  fuzz::clear_dir();
  const std::string worker = fuzz::write_file("worker.sh", "#!/bin/sh\nexec sleep 60\n");
  fs::permissions(worker, fs::perms::owner_all);

  ipc::ControllerOptions opt;
  opt.state_dir = fuzz::work_dir() + "/state";
  opt.command_endpoints = {"ipc://" + fuzz::work_dir() + "/commands"};
  opt.event_endpoints = {"ipc://" + fuzz::work_dir() + "/events"};
  opt.worker_executable = worker;
  opt.cpu_slots = 2;
  opt.cores = 2;
  opt.shutdown_timeout_s = 1;
  opt.alerts.recipe_webhooks = false;  // a recipe's webhook would be posted to
  ipc::Controller controller(opt);
  std::atomic<bool> stopped{false};
  std::thread serving([&] {
    controller.run();
    stopped = true;
  });

  zmq::context_t ctx(1);
  zmq::socket_t client(ctx, zmq::socket_type::dealer);
  client.set(zmq::sockopt::linger, 0);
  client.connect(opt.command_endpoints[0]);
  const std::string worker_endpoint = "ipc://" + opt.state_dir + "/workers.sock";
  std::map<std::string, zmq::socket_t> workers;  // by routing id
  bool shut_down = false;
  for (auto frame : frames_of(data, size)) {
    if (frame.rfind("worker ", 0) == 0) {
      const size_t eol = frame.find('\n');
      const std::string identity(frame.substr(7, eol == std::string_view::npos ? std::string_view::npos : eol - 7));
      frame.remove_prefix(eol == std::string_view::npos ? frame.size() : eol + 1);
      // ZeroMQ's bounds on a routing id: 1 to 255 bytes, not starting with a zero byte.
      if (identity.empty() || identity.size() > 255 || identity[0] == '\0') continue;
      auto [at, fresh] = workers.try_emplace(identity, ctx, zmq::socket_type::dealer);
      if (fresh) {
        at->second.set(zmq::sockopt::linger, 0);
        at->second.set(zmq::sockopt::routing_id, identity);
        at->second.connect(worker_endpoint);
      }
      (void)at->second.send(zmq::buffer(frame.data(), frame.size()), zmq::send_flags::none);
      continue;
    }
    (void)client.send(zmq::buffer(frame.data(), frame.size()), zmq::send_flags::none);
    const auto reply = reply_to(client, stopped);
    if (!reply) {
      if (!shut_down) fuzz::fault("the controller stopped without a shutdown request");
      break;
    }
    shut_down = check_reply(*reply, frame) || shut_down;
  }
  if (!shut_down) {
    (void)client.send(zmq::str_buffer(R"({"v":1,"id":"after","type":"info"})"), zmq::send_flags::none);
    const auto reply = reply_to(client, stopped);
    if (!reply || json::parse(*reply).value("ok", false) != true)
      fuzz::fault("the controller did not answer info after the input's frames");
  }
  controller.stop();
  controller.stop();  // the second stop does not wait for checkpoints: no worker saves any
  serving.join();
  return 0;
}
