// The controller's event socket (XPUB): every event of every run leaves through here,
// numbered per run and stamped with this controller's epoch (docs/protocol.md, Events).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

namespace tide::ipc {

class EventBus {
 public:
  EventBus(zmq::context_t& ctx, std::string epoch);

  // Bound by the controller, with the command socket's security.
  zmq::socket_t& socket() { return socket_; }
  const std::string& epoch() const { return epoch_; }

  // A snapshot event repeats the run's current number: it is a copy of what was sent.
  void publish(const std::string& run, const std::string& kind, nlohmann::json body, bool snapshot = false);
  // `fn` sees every event published from now on, snapshots aside, on the publishing
  // (controller's) thread: it must not block.
  void observe(std::function<void(const std::string& run, const std::string& kind, const nlohmann::json& body)> fn) {
    observers_.push_back(std::move(fn));
  }
  // Reads the subscriptions that arrived; on_subscribe(prefix) for each new one, so that
  // a late subscriber gets what it missed.
  void serve_subscriptions(const std::function<void(const std::string& prefix)>& on_subscribe);

 private:
  zmq::socket_t socket_;
  std::string epoch_;
  std::map<std::string, int64_t> seq_;  // per run
  std::vector<std::function<void(const std::string&, const std::string&, const nlohmann::json&)>> observers_;
};

double unix_now();

}  // namespace tide::ipc
