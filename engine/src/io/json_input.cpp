#include "tide/engine/io/json_input.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace tide {

std::optional<int64_t> json_int64(const nlohmann::json& v) {
  if (v.is_number_unsigned())
    return v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX) ? std::optional<int64_t>(v.get<int64_t>())
                                                                 : std::nullopt;
  if (v.is_number_integer()) return v.get<int64_t>();
  return std::nullopt;
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
