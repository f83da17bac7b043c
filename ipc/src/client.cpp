#include "tide/ipc/client.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "tide/engine/io/json_input.h"
#include "tide/engine/io/utf8.h"

namespace tide::ipc {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {
// zmq_poll returns early with EINTR when a signal arrives (the Go runtime preempts its
// threads with SIGURG, a host process may use timers): poll again for what is left.
void poll_in(zmq::pollitem_t& item, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    try {
      zmq::poll(&item, 1, std::max(std::chrono::milliseconds(0),
                                   std::chrono::duration_cast<std::chrono::milliseconds>(
                                       deadline - std::chrono::steady_clock::now())));
      return;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
  }
}
// The first string of `value` (a key or a value) that is not UTF-8, as "path: what", or "".
// JSON text holds only UTF-8, and what a caller hands a request (an HTTP query, a C API
// argument) may hold any bytes.
std::string non_utf8(const json& value, const std::string& path) {
  if (value.is_string()) {
    const auto& text = value.get_ref<const std::string&>();
    const size_t at = first_non_utf8(text);
    if (at == std::string::npos) return "";
    return fmt::format("{}: byte 0x{:02X} at offset {} is not UTF-8", path,
                       static_cast<unsigned>(static_cast<unsigned char>(text[at])), at);
  }
  if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      if (const size_t at = first_non_utf8(key); at != std::string::npos)
        return fmt::format("{}: a key's byte at offset {} is not UTF-8", path, at);
      if (std::string found = non_utf8(item, path + "." + key); !found.empty()) return found;
    }
  }
  if (value.is_array()) {
    for (size_t i = 0; i < value.size(); ++i)
      if (std::string found = non_utf8(value[i], fmt::format("{}[{}]", path, i)); !found.empty()) return found;
  }
  return "";
}
}  // namespace

void CurveClient::apply(zmq::socket_t& socket) const {
  if (!enabled()) return;
  socket.set(zmq::sockopt::curve_serverkey, server_public_key);
  socket.set(zmq::sockopt::curve_publickey, public_key);
  socket.set(zmq::sockopt::curve_secretkey, secret_key);
}

Client::Client(const std::string& endpoint, std::chrono::milliseconds timeout, CurveClient curve)
    : endpoint_(endpoint), timeout_(timeout), curve_(std::move(curve)) {
  connect();
}

void Client::connect() {
  socket_.emplace(ctx_, zmq::socket_type::dealer);
  socket_->set(zmq::sockopt::linger, 0);
  curve_.apply(*socket_);
  try {
    socket_->connect(endpoint_);
  } catch (const zmq::error_t& e) {
    throw ClientError("transport", fmt::format("cannot connect to {}: {}", endpoint_, e.what()));
  }
}

json Client::request(const std::string& type, const json& body) {
  const int64_t id = ++next_id_;
  if (const std::string found = non_utf8(body, type); !found.empty())
    throw ClientError("bad_request", fmt::format("request {}", found));
  const std::string text = json{{"v", kProtocolVersion}, {"id", id}, {"type", type}, {"body", body}}.dump();
  if (!socket_->send(zmq::buffer(text), zmq::send_flags::dontwait)) {
    zmq::pollitem_t out{socket_->handle(), 0, ZMQ_POLLOUT, 0};
    poll_in(out, timeout_);
    if (!(out.revents & ZMQ_POLLOUT) || !socket_->send(zmq::buffer(text), zmq::send_flags::dontwait)) {
      connect();
      throw ClientError("timeout", fmt::format("no daemon answered at {} within {} ms", endpoint_, timeout_.count()));
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    zmq::pollitem_t in{socket_->handle(), 0, ZMQ_POLLIN, 0};
    if (left.count() > 0) poll_in(in, left);
    if (!(in.revents & ZMQ_POLLIN)) {
      connect();
      throw ClientError("timeout", fmt::format("no reply from {} within {} ms to '{}'", endpoint_, timeout_.count(), type));
    }
    zmq::message_t msg;
    if (!socket_->recv(msg, zmq::recv_flags::dontwait)) continue;
    if (msg.empty() && msg.more()) continue;  // a REQ-style delimiter
    const json reply = parse_json_or_discard(msg.to_string_view());
    if (!reply.is_object()) throw ClientError("transport", "the daemon sent a reply that is not a JSON object");
    if (reply.value("id", json()) != json(id)) continue;  // a late reply to an earlier request
    if (reply.value("ok", false)) return reply.value("body", json::object());
    const json err = reply.value("error", json::object());
    throw ClientError(err.value("code", "internal"), err.value("message", std::string("(no message)")));
  }
}

std::string Client::event_endpoint() {
  const json info = request("info");
  const json eps = info.value("endpoints", json::object()).value("events", json::array());
  const std::string scheme = endpoint_.substr(0, endpoint_.find("://"));
  for (const auto& e : eps) {
    if (!e.is_string() || e.get<std::string>().rfind(scheme + "://", 0) != 0) continue;
    const std::string ep = e.get<std::string>();
    if (scheme != "tcp") return ep;
    const auto host_end = endpoint_.rfind(':'), port_at = ep.rfind(':');
    if (host_end == std::string::npos || port_at == std::string::npos) return ep;
    return endpoint_.substr(0, host_end) + ep.substr(port_at);
  }
  if (eps.empty() || !eps[0].is_string())
    throw ClientError("transport", fmt::format("the daemon at {} names no event endpoint", endpoint_));
  return eps[0].get<std::string>();
}

Subscriber::Subscriber(const std::string& endpoint, const std::vector<std::string>& prefixes,
                       const CurveClient& curve) {
  socket_.set(zmq::sockopt::linger, 0);
  curve.apply(socket_);
  for (const auto& p : prefixes) socket_.set(zmq::sockopt::subscribe, p);
  socket_.connect(endpoint);
}

std::optional<Event> Subscriber::next(std::chrono::milliseconds timeout) {
  zmq::pollitem_t in{socket_.handle(), 0, ZMQ_POLLIN, 0};
  poll_in(in, timeout);
  if (!(in.revents & ZMQ_POLLIN)) return std::nullopt;
  zmq::message_t topic, body;
  if (!socket_.recv(topic, zmq::recv_flags::dontwait)) return std::nullopt;
  if (!topic.more() || !socket_.recv(body, zmq::recv_flags::dontwait)) return std::nullopt;
  Event e;
  e.topic = topic.to_string();
  e.message = parse_json_or_discard(body.to_string_view());
  if (!e.message.is_object()) return std::nullopt;
  return e;
}

std::string default_state_dir() {
  if (const char* d = std::getenv("TIDE_STATE_DIR"); d && *d) return d;
  if (const char* x = std::getenv("XDG_STATE_HOME"); x && *x) return (fs::path(x) / "tide").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : "/tmp") / ".local/state/tide").string();
}

std::string default_command_endpoint(const std::string& state_dir) {
  return "ipc://" + (fs::absolute(state_dir) / "command.sock").string();
}

std::string default_event_endpoint(const std::string& state_dir) {
  return "ipc://" + (fs::absolute(state_dir) / "events.sock").string();
}

}  // namespace tide::ipc
