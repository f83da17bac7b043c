// JSON that arrives from outside the process (a socket frame, a manifest, a file a user
// hands us) is parsed here, and only here.
//
// nlohmann::json parses iteratively, but copying, comparing and dumping a value recurse
// once per level: `[[[[...]]]]` nested 100,000 deep parses fine and then overflows the
// stack the first time it is copied. The nesting is therefore measured before parsing,
// in one pass that never recurses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace tide {

// Deeper than any document tide reads or writes (manifests and configs stay under 8;
// Hugging Face tokenizer files under 12), shallow enough for any thread's stack.
inline constexpr int kMaxJsonDepth = 64;

// Text that is not JSON, or nests too deep; the message names the document.
class JsonInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A number that is an integer within int64, else nothing. Checked before converting:
// nlohmann turns 2e27 into an integer by a cast whose result is undefined, and 2^64 - 1
// into -1.
std::optional<int64_t> json_int64(const nlohmann::json& v);

// nlohmann's message without its tag: "[json.exception.type_error.302] type must be
// string, but is number" becomes "type must be string, but is number".
std::string json_error_text(const nlohmann::json::exception& e);

// The deepest nesting of arrays and objects in `text` (0 for a scalar), counted through
// strings and escapes without parsing; it stops counting at `limit` + 1.
int json_nesting_depth(std::string_view text, int limit = kMaxJsonDepth);

// Parses `text`; `what` names it in errors ("manifest.json of step-00000010", "request").
// Throws JsonInputError when it is not JSON or nests deeper than `max_depth`.
nlohmann::json parse_json_input(std::string_view text, const std::string& what, int max_depth = kMaxJsonDepth);

// As parse_json_input, but text that is not JSON or nests too deep gives a discarded
// value (`is_discarded()`): for messages that are dropped rather than answered.
nlohmann::json parse_json_or_discard(std::string_view text, int max_depth = kMaxJsonDepth);

// The whole file at `path`, parsed as above; names the file in errors (also when it cannot
// be read, or is larger than `max_bytes`).
nlohmann::json read_json_file(const std::string& path, std::size_t max_bytes = std::size_t{1} << 30);

}  // namespace tide
