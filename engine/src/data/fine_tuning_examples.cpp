#include "tide/engine/data/fine_tuning_examples.h"

#include <stdexcept>

#include <fmt/format.h>

#include "tide/engine/io/json_input.h"

namespace tide {
namespace {

using json = nlohmann::json;

bool blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// Calls fn(object, "path:line") for each line of `text` that is not blank; a line that
// is not a JSON object throws, showing what it is and the form `wanted`.
template <class F>
void for_each_object(std::string_view text, const std::string& path, const char* wanted, F&& fn) {
  int64_t line_number = 0;
  for (size_t start = 0; start < text.size();) {
    const size_t end = std::min(text.find('\n', start), text.size());
    const std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++line_number;
    if (blank(line)) continue;
    const std::string where = fmt::format("{}:{}", path, line_number);
    const json example = parse_json_input(line, where);
    if (!example.is_object())
      throw std::runtime_error(fmt::format("{}: {} is not an object {}", where, example.dump().substr(0, 80), wanted));
    fn(example, where);
  }
}

// The string field `key` of `object`, or an error naming where it is wanted.
std::string text_field(const json& object, const char* key, const std::string& where) {
  const auto it = object.find(key);
  if (it == object.end()) throw std::runtime_error(fmt::format("{}: no \"{}\"", where, key));
  if (!it->is_string())
    throw std::runtime_error(fmt::format("{}: \"{}\" is {}, not a string", where, key, it->type_name()));
  return it->get<std::string>();
}

// A message's content: a string, or OpenAI's list of parts, whose texts are joined as
// written (no separator, as Qwen2-VL's template joins them; a template that trims then
// trims the whole). A part that is not text (an image, audio) is refused by name: tide
// trains on text alone.
std::string message_content(const json& message, const char* key, const std::string& where) {
  const auto it = message.find(key);
  if (it != message.end() && !it->is_array() && !it->is_string())
    throw std::runtime_error(
        fmt::format("{}: \"{}\" is {}, not a string nor a list of parts", where, key, it->type_name()));
  if (it == message.end() || it->is_string()) return text_field(message, key, where);
  std::string joined;
  for (size_t k = 0; k < it->size(); ++k) {
    const json& part = (*it)[k];
    const std::string at = fmt::format("{} part {}", where, k);
    if (!part.is_object()) throw std::runtime_error(fmt::format("{} is {}, not an object", at, part.type_name()));
    const std::string type = text_field(part, "type", at);
    if (type != "text")
      throw std::runtime_error(
          fmt::format("{} is of type \"{}\": tide trains on text parts alone", at, type.substr(0, 40)));
    joined += text_field(part, "text", at);
  }
  return joined;
}

ChatRole role_named(const std::string& role, const std::string& where) {
  if (role == "system") return ChatRole::kSystem;
  if (role == "user" || role == "human") return ChatRole::kUser;
  if (role == "assistant" || role == "gpt") return ChatRole::kAssistant;
  throw std::runtime_error(fmt::format("{}: role \"{}\" is none of system, user, assistant (ShareGPT's human, gpt)",
                                       where, role.substr(0, 40)));
}

}  // namespace

std::vector<PromptCompletion> read_prompt_completions(std::string_view text, const std::string& path) {
  std::vector<PromptCompletion> out;
  for_each_object(text, path, "{\"prompt\": ..., \"completion\": ...}",
                  [&](const json& example, const std::string& where) {
                    PromptCompletion pc{text_field(example, "prompt", where), text_field(example, "completion", where)};
                    if (pc.completion.empty())
                      throw std::runtime_error(where + ": an empty \"completion\": the example would teach nothing");
                    out.push_back(std::move(pc));
                  });
  return out;
}

std::vector<Conversation> read_conversations(std::string_view text, const std::string& path) {
  std::vector<Conversation> out;
  for_each_object(text, path, "{\"messages\": [...]}", [&](const json& example, const std::string& where) {
    // OpenAI's {"role", "content"} messages, or ShareGPT's {"from", "value"}.
    const bool share_gpt = !example.contains("messages") && example.contains("conversations");
    const char* list = share_gpt ? "conversations" : "messages";
    const char* role_key = share_gpt ? "from" : "role";
    const char* content_key = share_gpt ? "value" : "content";
    const auto messages = example.find(list);
    if (messages == example.end())
      throw std::runtime_error(where + ": no \"messages\" (nor ShareGPT's \"conversations\")");
    if (!messages->is_array())
      throw std::runtime_error(
          fmt::format("{}: \"{}\" is {}, not a list of messages", where, list, messages->type_name()));
    Conversation c{where, {}};
    bool assistant_speaks = false;
    for (size_t i = 0; i < messages->size(); ++i) {
      const json& m = (*messages)[i];
      const std::string at = fmt::format("{}: message {}", where, i);
      if (!m.is_object()) throw std::runtime_error(fmt::format("{} is {}, not an object", at, m.type_name()));
      c.messages.push_back({role_named(text_field(m, role_key, at), at), message_content(m, content_key, at)});
      assistant_speaks |= c.messages.back().role == ChatRole::kAssistant && !c.messages.back().content.empty();
    }
    if (!assistant_speaks)
      throw std::runtime_error(where + ": no assistant message with content: the conversation would teach nothing");
    out.push_back(std::move(c));
  });
  return out;
}

}  // namespace tide
