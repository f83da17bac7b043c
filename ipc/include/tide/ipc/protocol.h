// The wire protocol between clients and the controller (docs/protocol.md is the
// contract): one JSON object per request and per reply on the command socket, a topic
// frame and a JSON object per event on the event socket.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tide::ipc {

constexpr int kProtocolVersion = 1;
// Requests above this many bytes are refused with too_large; the sockets drop peers that
// send more than kTransportLimit in one message.
constexpr size_t kRequestLimit = 4u << 20;
constexpr int64_t kTransportLimit = 16 << 20;

// Never renumbered, never reused: the C API and the bindings carry the numbers.
enum class ErrorCode {
  bad_request = 1,          // not JSON, not an object, a field missing or of the wrong type
  unsupported_version = 2,  // "v" is not a protocol version this controller speaks
  unknown_type = 3,         // no such request type
  not_found = 4,            // no such run
  invalid_state = 5,        // the run's state does not allow it (pause a queued run)
  invalid_recipe = 6,       // the recipe does not load or validate
  invalid_value = 7,        // set: not a field, not live, or a value out of range
  too_large = 8,            // the request exceeds kRequestLimit
  unauthorized = 9,         // the client's role may not do this (observer vs operator)
  unavailable = 10,         // cannot be done on this daemon (more workers than slots)
  internal = 11,            // a bug: the message says what failed
};
const char* error_name(ErrorCode code);
std::optional<ErrorCode> error_from_name(std::string_view name);

// An error that becomes an error reply.
class ProtocolError : public std::runtime_error {
 public:
  ProtocolError(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

struct Request {
  nlohmann::json id;  // echoed in the reply; any JSON value the client chose
  std::string type;
  nlohmann::json body;  // always an object
};

// Parses and checks the envelope; throws ProtocolError (bad_request, too_large,
// unsupported_version). `id` is filled as soon as it could be read, for the error reply.
Request parse_request(std::string_view frame, nlohmann::json& id);
std::string reply_ok(const nlohmann::json& id, const nlohmann::json& body);
std::string reply_error(const nlohmann::json& id, ErrorCode code, const std::string& message);

// Event topics: "run.<id>.<kind>" and "daemon.<kind>".
std::string run_topic(const std::string& run, const std::string& kind);

// Run ids, names and field paths that travel in topics and paths: letters, digits, '.',
// '_' and '-', 1..64 characters.
bool is_safe_name(std::string_view s);

// Typed access to request bodies, with bad_request naming the field.
const nlohmann::json& require(const nlohmann::json& body, const char* field, nlohmann::json::value_t type);
std::string require_string(const nlohmann::json& body, const char* field);
int64_t optional_int(const nlohmann::json& body, const char* field, int64_t fallback, int64_t lo, int64_t hi);

}  // namespace tide::ipc
