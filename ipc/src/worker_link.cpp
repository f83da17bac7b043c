#include "tide/ipc/worker_link.h"

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <zmq.hpp>

#include "tide/engine/io/json_input.h"
#include "wakeup.h"

namespace tide::ipc {
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::optional<WorkerIdentity> worker_identity_from_environment(int rank) {
  const char* endpoint = std::getenv("TIDE_CONTROLLER");
  const char* run = std::getenv("TIDE_RUN_ID");
  if (!endpoint || !run || !*endpoint) return std::nullopt;
  WorkerIdentity id;
  id.endpoint = endpoint;
  id.run = run;
  if (const char* a = std::getenv("TIDE_ATTEMPT")) id.attempt = std::atoll(a);
  if (const char* k = std::getenv("TIDE_CONTROLLER_KEY_FILE")) id.key_file = k;
  id.rank = rank;
  return id;
}

WorkerLink::WorkerLink(WorkerIdentity id) : id_(std::move(id)) {
  if (!id_.key_file.empty()) keys_ = read_worker_link_keys(id_.key_file);
  wake_ = std::make_unique<Wakeup>("the worker link");
  send("hello", {{"pid", ::getpid()}});
  thread_ = std::thread([this] { loop(); });
}

WorkerLink::~WorkerLink() {
  stop_ = true;
  wake_->wake();
  if (thread_.joinable()) thread_.join();
}

void WorkerLink::send(const std::string& type, json body) {
  json message = {{"type", type}, {"run", id_.run}, {"attempt", id_.attempt}, {"rank", id_.rank}, {"body", std::move(body)}};
  {
    std::lock_guard<std::mutex> lock(mu_);
    outgoing_.push_back(message.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  wake_->wake();
}

std::string WorkerLink::take_commands() {
  std::lock_guard<std::mutex> lock(mu_);
  if (commands_.empty()) return {};
  std::string text = commands_.dump();
  commands_ = json::array();
  return text;
}

std::optional<json> WorkerLink::ask(const std::string& type, json body, std::chrono::milliseconds timeout) {
  int64_t query = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    query = next_query_++;
  }
  body["query"] = query;
  send(type, std::move(body));
  std::unique_lock<std::mutex> lock(mu_);
  if (!answered_.wait_for(lock, timeout, [&] { return answers_.count(query) > 0; })) return std::nullopt;
  json answer = std::move(answers_[query]);
  answers_.erase(query);
  return answer;
}

void WorkerLink::loop() {
  try {
    zmq::context_t ctx(1);
    zmq::socket_t socket(ctx, zmq::socket_type::dealer);
    socket.set(zmq::sockopt::routing_id, fmt::format("{}:{}:{}", id_.run, id_.attempt, id_.rank));
    socket.set(zmq::sockopt::linger, 1000);
    socket.set(zmq::sockopt::sndhwm, 10000);
    if (keys_) {
      socket.set(zmq::sockopt::curve_serverkey, keys_->server_public);
      socket.set(zmq::sockopt::curve_publickey, keys_->own.public_key);
      socket.set(zmq::sockopt::curve_secretkey, keys_->own.secret_key);
    }
    socket.connect(id_.endpoint);
    auto next_heartbeat = Clock::now();
    while (true) {
      const bool stopping = stop_.load();
      if (Clock::now() >= next_heartbeat && !stopping) {
        send("heartbeat", json::object());
        next_heartbeat = Clock::now() + std::chrono::seconds(1);
      }
      std::deque<std::string> batch;
      {
        std::lock_guard<std::mutex> lock(mu_);
        batch.swap(outgoing_);
      }
      for (auto& text : batch) (void)socket.send(zmq::buffer(text), zmq::send_flags::dontwait);
      if (stopping) break;  // linger delivers what was just sent
      // The timeout paces the heartbeats; a send() wakes the poll at once.
      zmq::pollitem_t items[] = {{socket.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, wake_->fd(), ZMQ_POLLIN, 0}};
      zmq::poll(items, 2, std::chrono::milliseconds(50));
      if (items[1].revents & ZMQ_POLLIN) wake_->drain();
      zmq::pollitem_t& item = items[0];
      if (item.revents & ZMQ_POLLIN) {
        zmq::message_t msg;
        while (socket.recv(msg, zmq::recv_flags::dontwait)) {
          const json j = parse_json_or_discard(msg.to_string_view());
          const std::string type = j.is_object() ? j.value("type", "") : "";
          if (type == "commands" && j.contains("commands") && j["commands"].is_array()) {
            std::lock_guard<std::mutex> lock(mu_);
            for (const auto& c : j["commands"]) commands_.push_back(c);
          } else if (type == "answer" && j.contains("query") && j["query"].is_number_integer()) {
            {
              std::lock_guard<std::mutex> lock(mu_);
              answers_[j["query"].get<int64_t>()] = j.value("body", json());
            }
            answered_.notify_all();
          } else {
            spdlog::warn("worker link: ignoring a message from the controller: {}", msg.to_string());
          }
        }
      }
    }
  } catch (const std::exception& e) {
    spdlog::error("worker link to {}: {}", id_.endpoint, e.what());
  }
}

}  // namespace tide::ipc
