// A client of the controller's sockets (docs/protocol.md): requests with a timeout on
// the command socket, events from the event socket. Used by the CLI and the C API.
#pragma once

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "tide/ipc/protocol.h"

namespace tide::ipc {

// An error reply from the daemon, or no reply in time.
class ClientError : public std::runtime_error {
 public:
  ClientError(std::string code, const std::string& message) : std::runtime_error(message), code_(std::move(code)) {}
  // A protocol error name ("not_found"), or "timeout" / "transport".
  const std::string& code() const { return code_; }

 private:
  std::string code_;
};

// A client's CURVE identity toward a daemon serving CURVE (empty: none).
struct CurveClient {
  std::string server_public_key;  // the daemon's public key (Z85)
  std::string public_key, secret_key;
  bool enabled() const { return !server_public_key.empty(); }
  void apply(zmq::socket_t& socket) const;
};

class Client {
 public:
  explicit Client(const std::string& endpoint, std::chrono::milliseconds timeout = std::chrono::seconds(10),
                  CurveClient curve = {});
  // The reply's body; throws ClientError for an error reply or no reply in time. After a
  // timeout the connection is made again, so a late reply cannot be taken for the next.
  nlohmann::json request(const std::string& type, const nlohmann::json& body = nlohmann::json::object());
  const std::string& endpoint() const { return endpoint_; }
  // The daemon's event endpoint for this client (asks `info`): one of the same transport
  // as the command endpoint; over TCP with the command endpoint's host, since the daemon
  // may have bound a wildcard address.
  std::string event_endpoint();

 private:
  void connect();
  std::string endpoint_;
  std::chrono::milliseconds timeout_;
  CurveClient curve_;
  zmq::context_t ctx_{1};
  std::optional<zmq::socket_t> socket_;
  int64_t next_id_ = 0;
};

struct Event {
  std::string topic;
  nlohmann::json message;  // {"v", "run", "seq", "kind", "time", "epoch", "body"[, "snapshot"]}
};

class Subscriber {
 public:
  // Subscribes to every prefix ("run.<id>." for one run, "" for everything).
  Subscriber(const std::string& endpoint, const std::vector<std::string>& prefixes, const CurveClient& curve = {});
  std::optional<Event> next(std::chrono::milliseconds timeout);

 private:
  zmq::context_t ctx_{1};
  zmq::socket_t socket_{ctx_, zmq::socket_type::sub};
};

// Where the local daemon is: $TIDE_STATE_DIR, else $XDG_STATE_HOME/tide, else
// ~/.local/state/tide.
std::string default_state_dir();
// The daemon's command endpoint on this machine: the ipc socket in the state directory.
std::string default_command_endpoint(const std::string& state_dir);
std::string default_event_endpoint(const std::string& state_dir);

}  // namespace tide::ipc
