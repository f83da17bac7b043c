#include "tide/engine/io/json_input.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace tide {

std::size_t first_non_utf8(std::string_view text) {
  // The Unicode Standard's table of well-formed sequences (no overlong forms, no
  // surrogates, nothing above U+10FFFF): the second byte's range depends on the first.
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    const unsigned char c = b[i];
    int more = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
      ++i;
      continue;
    }
    if (c >= 0xC2 && c <= 0xDF)
      more = 1;
    else if (c == 0xE0)
      more = 2, lo = 0xA0;
    else if (c == 0xED)
      more = 2, hi = 0x9F;
    else if (c >= 0xE1 && c <= 0xEF)
      more = 2;
    else if (c == 0xF0)
      more = 3, lo = 0x90;
    else if (c == 0xF4)
      more = 3, hi = 0x8F;
    else if (c >= 0xF1 && c <= 0xF3)
      more = 3;
    else
      return i;
    if (n - i <= static_cast<std::size_t>(more)) return i;
    if (b[i + 1] < lo || b[i + 1] > hi) return i;
    for (int k = 2; k <= more; ++k)
      if (b[i + k] < 0x80 || b[i + k] > 0xBF) return i;
    i += static_cast<std::size_t>(more) + 1;
  }
  return std::string_view::npos;
}

std::string json_error_text(const nlohmann::json::exception& e) {
  // The tag ("[json.exception.parse_error.101] ") is of no use to a reader.
  std::string_view why = e.what();
  if (const auto tag_end = why.find("] "); why.rfind('[', 0) == 0 && tag_end != std::string_view::npos)
    why.remove_prefix(tag_end + 2);
  return std::string(why);
}

int json_nesting_depth(std::string_view text, int limit) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > limit) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

nlohmann::json parse_json_input(std::string_view text, const std::string& what, int max_depth) {
  if (json_nesting_depth(text, max_depth) > max_depth)
    throw JsonInputError(fmt::format("{}: JSON nested more than {} levels deep", what, max_depth));
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    // A syntax error, or a number too large for a double (out_of_range 406, "1e999").
    throw JsonInputError(fmt::format("{}: not valid JSON ({})", what, json_error_text(e)));
  }
}

nlohmann::json parse_json_or_discard(std::string_view text, int max_depth) {
  if (json_nesting_depth(text, max_depth) > max_depth) return nlohmann::json(nlohmann::json::value_t::discarded);
  return nlohmann::json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
}

nlohmann::json read_json_file(const std::string& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw JsonInputError(fmt::format("{}: cannot be read", path));
  in.seekg(0, std::ios::end);
  const auto size = static_cast<std::size_t>(in.tellg());
  if (size > max_bytes)
    throw JsonInputError(fmt::format("{}: {} bytes, more than the {} a JSON file may have", path, size, max_bytes));
  in.seekg(0);
  std::string text(size, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(size)))
    throw JsonInputError(fmt::format("{}: cannot be read", path));
  return parse_json_input(text, path);
}

}  // namespace tide
