// The C API's error side: the thread's last message, and the boundary every entry point
// goes through, which turns any C++ exception into a status code and a message.
#pragma once

#include <stdexcept>
#include <string>

#include "tide/tide.h"

namespace tide::capi {

// A failure with its C status code.
class Failure : public std::runtime_error {
 public:
  Failure(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// Sets the thread's last error and returns `code`.
int fail(int code, const std::string& message);
void clear_error();

int guarded_impl(const char* function, int (*call)(void*), void* context) noexcept;

// Runs `body` (returning TIDE_OK or a code) with the thread's last error cleared, mapping
// Failure, ipc::ClientError, std::bad_alloc and anything else to codes.
template <class F>
int guarded(const char* function, F&& body) noexcept {
  return guarded_impl(
      function, [](void* c) { return (*static_cast<F*>(c))(); }, &body);
}

// Argument checks: throw Failure(TIDE_ERR_INVALID_ARGUMENT) naming the argument.
void require(const void* pointer, const char* name);
void require_text(const char* text, const char* name);
// An option struct's version: 0 (uninitialised) or newer than `known` is refused.
void require_version(uint32_t version, uint32_t known, const char* name);

// A copy the caller frees with tide_string_free.
char* duplicate(const std::string& text);

}  // namespace tide::capi
