#include "tide/engine/data/prompt_completion.h"

#include <stdexcept>

#include <fmt/format.h>

#include "tide/engine/io/json_input.h"

namespace tide {
namespace {

bool blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// The string field `key` of `example`, or an error naming where it is wanted.
std::string text_field(const nlohmann::json& example, const char* key, const std::string& where) {
  const auto it = example.find(key);
  if (it == example.end()) throw std::runtime_error(fmt::format("{}: no \"{}\"", where, key));
  if (!it->is_string())
    throw std::runtime_error(fmt::format("{}: \"{}\" is {}, not a string", where, key, it->type_name()));
  return it->get<std::string>();
}

}  // namespace

std::vector<PromptCompletion> read_prompt_completions(std::string_view text, const std::string& path) {
  std::vector<PromptCompletion> out;
  int64_t line_number = 0;
  for (size_t start = 0; start < text.size();) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (blank(line)) continue;
    const std::string where = fmt::format("{}:{}", path, line_number);
    const nlohmann::json example = parse_json_input(line, where);
    if (!example.is_object())
      throw std::runtime_error(fmt::format("{}: {} is not an object {{\"prompt\": ..., \"completion\": ...}}", where,
                                           example.dump().substr(0, 80)));
    PromptCompletion pc{text_field(example, "prompt", where), text_field(example, "completion", where)};
    if (pc.completion.empty())
      throw std::runtime_error(where + ": an empty \"completion\": the example would teach nothing");
    out.push_back(std::move(pc));
  }
  return out;
}

}  // namespace tide
