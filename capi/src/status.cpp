#include "status.h"

#include <cstdlib>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "tide/ipc/client.h"
#include "tide/ipc/protocol.h"

namespace tide::capi {
namespace {
thread_local std::string last_error;

// A daemon's error name → its code (docs/protocol.md numbers, negated).
int code_of(const ipc::ClientError& e) {
  if (e.code() == "timeout") return TIDE_ERR_TIMEOUT;
  if (e.code() == "transport") return TIDE_ERR_TRANSPORT;
  if (const auto code = ipc::error_from_name(e.code())) return -static_cast<int>(*code);
  return TIDE_ERR_INTERNAL;
}
}  // namespace

int fail(int code, const std::string& message) {
  last_error = message;
  return code;
}

void clear_error() { last_error.clear(); }

int guarded_impl(const char* function, int (*call)(void*), void* context) noexcept {
  try {
    clear_error();
    return call(context);
  } catch (const Failure& e) {
    return fail(e.code(), fmt::format("{}: {}", function, e.what()));
  } catch (const ipc::ClientError& e) {
    return fail(code_of(e), fmt::format("{}: {}", function, e.what()));
  } catch (const std::bad_alloc&) {
    return fail(TIDE_ERR_INTERNAL, fmt::format("{}: out of memory", function));
  } catch (const std::exception& e) {
    return fail(TIDE_ERR_INTERNAL, fmt::format("{}: {}", function, e.what()));
  } catch (...) {
    return fail(TIDE_ERR_INTERNAL, fmt::format("{}: an unknown exception", function));
  }
}

void require(const void* pointer, const char* name) {
  if (!pointer) throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("{} is NULL", name));
}

void require_text(const char* text, const char* name) {
  require(text, name);
  if (!*text) throw Failure(TIDE_ERR_INVALID_ARGUMENT, fmt::format("{} is empty", name));
}

void require_version(uint32_t version, uint32_t known, const char* name) {
  if (version == 0)
    throw Failure(TIDE_ERR_INVALID_ARGUMENT,
                  fmt::format("{}.version is 0: initialise the struct with its _INIT macro or _init()", name));
  if (version > known)
    throw Failure(TIDE_ERR_STRUCT_VERSION,
                  fmt::format("{}.version is {}; this library (tide {}) knows up to {}", name, version,
                              tide_version(), known));
}

char* duplicate(const std::string& text) {
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (!out) throw std::bad_alloc();
  std::memcpy(out, text.c_str(), text.size() + 1);
  return out;
}

}  // namespace tide::capi

using tide::capi::last_error;

extern "C" {

const char* tide_version(void) { return TIDE_VERSION; }

int tide_version_number(void) { return TIDE_VERSION_NUMBER; }

const char* tide_error_last(void) { return last_error.c_str(); }

const char* tide_strerror(int code) {
  switch (code) {
    case TIDE_OK: return "ok";
    case TIDE_ERR_BAD_REQUEST: return "the engine could not read the request";
    case TIDE_ERR_UNSUPPORTED_VERSION: return "the engine speaks another protocol version";
    case TIDE_ERR_UNKNOWN_TYPE: return "the engine does not know this request";
    case TIDE_ERR_NOT_FOUND: return "no such run";
    case TIDE_ERR_INVALID_STATE: return "the run's state does not allow it";
    case TIDE_ERR_INVALID_RECIPE: return "the recipe does not load or validate";
    case TIDE_ERR_INVALID_VALUE: return "not a live field, or a value out of range";
    case TIDE_ERR_TOO_LARGE: return "the request is too large";
    case TIDE_ERR_UNAUTHORIZED: return "this client's role may not do that";
    case TIDE_ERR_UNAVAILABLE: return "the engine cannot do that (not enough slots)";
    case TIDE_ERR_INTERNAL: return "an internal error";
    case TIDE_ERR_INVALID_ARGUMENT: return "an invalid argument";
    case TIDE_ERR_INVALID_HANDLE: return "a handle that is closed or was not made by this library";
    case TIDE_ERR_TIMEOUT: return "no answer in time";
    case TIDE_ERR_TRANSPORT: return "cannot reach the engine";
    case TIDE_ERR_IO: return "a file could not be read or written";
    case TIDE_ERR_REENTRANT: return "not allowed from inside this subscription's callback";
    case TIDE_ERR_STRUCT_VERSION: return "an option struct newer than this library";
    default: return "unknown status code";
  }
}

void tide_string_free(char* s) { std::free(s); }

}  // extern "C"
