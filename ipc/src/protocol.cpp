#include "tide/ipc/protocol.h"

#include <fmt/format.h>

#include "tide/engine/io/json_input.h"


namespace tide::ipc {
using json = nlohmann::json;

namespace {
constexpr std::pair<ErrorCode, const char*> kNames[] = {
    {ErrorCode::bad_request, "bad_request"},   {ErrorCode::unsupported_version, "unsupported_version"},
    {ErrorCode::unknown_type, "unknown_type"}, {ErrorCode::not_found, "not_found"},
    {ErrorCode::invalid_state, "invalid_state"}, {ErrorCode::invalid_recipe, "invalid_recipe"},
    {ErrorCode::invalid_value, "invalid_value"}, {ErrorCode::too_large, "too_large"},
    {ErrorCode::unauthorized, "unauthorized"}, {ErrorCode::unavailable, "unavailable"},
    {ErrorCode::internal, "internal"},
};

const char* type_name(json::value_t t) {
  switch (t) {
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "null";
  }
}
}  // namespace

const char* error_name(ErrorCode code) {
  for (const auto& [c, name] : kNames)
    if (c == code) return name;
  return "internal";
}

std::optional<ErrorCode> error_from_name(std::string_view name) {
  for (const auto& [c, n] : kNames)
    if (name == n) return c;
  return std::nullopt;
}

Request parse_request(std::string_view frame, json& id) {
  id = nullptr;
  if (frame.size() > kRequestLimit)
    throw ProtocolError(ErrorCode::too_large,
                        fmt::format("request of {} bytes exceeds the limit of {} bytes", frame.size(), kRequestLimit));
  json j;
  try {
    j = parse_json_input(frame, "request");
  } catch (const JsonInputError& e) {
    throw ProtocolError(ErrorCode::bad_request, e.what());
  }
  if (!j.is_object()) throw ProtocolError(ErrorCode::bad_request, "request is not a JSON object");
  if (j.contains("id")) {
    // An integer beyond 64 bits, or a number with a fraction, parses as a double and
    // could not come back unchanged: refused, rather than echoed as another number.
    if (j["id"].is_number_float())
      throw ProtocolError(ErrorCode::bad_request,
                          fmt::format("'id' is {}: a number id must be an integer of at most 64 bits",
                                      j["id"].dump()));
    id = std::move(j["id"]);
  }
  if (!j.contains("v") || !j["v"].is_number_integer())
    throw ProtocolError(ErrorCode::bad_request, "request has no integer protocol version 'v'");
  if (j["v"].get<int64_t>() != kProtocolVersion)
    throw ProtocolError(ErrorCode::unsupported_version,
                        fmt::format("protocol version {} is not supported; this controller speaks {}",
                                    j["v"].dump(), kProtocolVersion));
  if (!j.contains("type") || !j["type"].is_string())
    throw ProtocolError(ErrorCode::bad_request, "request has no string 'type'");
  Request r;
  r.id = id;
  r.type = j["type"].get<std::string>();
  r.body = j.value("body", json::object());
  if (!r.body.is_object())
    throw ProtocolError(ErrorCode::bad_request, fmt::format("'body' is {}, not an object", type_name(r.body.type())));
  return r;
}

std::string reply_ok(const json& id, const json& body) {
  // A body may carry bytes from outside (a run's log lines): any that are not UTF-8
  // become U+FFFD rather than fail the reply.
  return json{{"v", kProtocolVersion}, {"id", id}, {"ok", true}, {"body", body}}.dump(-1, ' ', false,
                                                                                      json::error_handler_t::replace);
}

std::string reply_error(const json& id, ErrorCode code, const std::string& message) {
  return json{{"v", kProtocolVersion},
              {"id", id},
              {"ok", false},
              {"error", {{"code", error_name(code)}, {"number", static_cast<int>(code)}, {"message", message}}}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string run_topic(const std::string& run, const std::string& kind) { return "run." + run + "." + kind; }

bool is_safe_name(std::string_view s) {
  if (s.empty() || s.size() > 64) return false;
  for (const char c : s)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

const json& require(const json& body, const char* field, json::value_t type) {
  if (!body.contains(field)) throw ProtocolError(ErrorCode::bad_request, fmt::format("body has no '{}'", field));
  const json& v = body[field];
  const bool ok = type == json::value_t::number_integer ? v.is_number_integer() : v.type() == type;
  if (!ok)
    throw ProtocolError(ErrorCode::bad_request,
                        fmt::format("'{}' is {}, not {}", field, type_name(v.type()), type_name(type)));
  return v;
}

std::string require_string(const json& body, const char* field) {
  return require(body, field, json::value_t::string).get<std::string>();
}

int64_t optional_int(const json& body, const char* field, int64_t fallback, int64_t lo, int64_t hi) {
  if (!body.contains(field) || body[field].is_null()) return fallback;
  const int64_t v = require(body, field, json::value_t::number_integer).get<int64_t>();
  if (v < lo || v > hi)
    throw ProtocolError(ErrorCode::bad_request, fmt::format("'{}' is {}, outside [{}, {}]", field, v, lo, hi));
  return v;
}

}  // namespace tide::ipc
