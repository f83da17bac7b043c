#include "tide/engine/data/fine_tuning_examples.h"

#include <optional>
#include <stdexcept>

#include <fmt/format.h>

#include "tide/engine/io/json_input.h"

namespace tide {
namespace {

using json = nlohmann::json;

bool blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// Calls fn(object, "path:line", line) for each line of `text` that is not blank; a line
// that is not a JSON object throws, showing what it is and the form `wanted`.
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
    fn(example, where, line);
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
  if (role == "tool") return ChatRole::kTool;
  throw std::runtime_error(fmt::format(
      "{}: role \"{}\" is none of system, user, assistant, tool (ShareGPT's human, gpt)", where, role.substr(0, 40)));
}

// An assistant's "tool_calls" (`calls`, from the line read with its keys in order): each
// OpenAI's {"type": "function", "function": {"name", "arguments"}}, or the function's
// fields alone (as transformers' templates take them).
std::vector<ToolCall> tool_calls_of(const nlohmann::ordered_json& calls, const std::string& where) {
  if (!calls.is_array())
    throw std::runtime_error(fmt::format("{}: \"tool_calls\" is {}, not a list", where, calls.type_name()));
  std::vector<ToolCall> out;
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string at = fmt::format("{} tool call {}", where, k);
    const auto& call = calls[k];
    if (!call.is_object()) throw std::runtime_error(fmt::format("{} is {}, not an object", at, call.type_name()));
    const auto& f = call.contains("function") ? call["function"] : call;
    if (!f.is_object())
      throw std::runtime_error(fmt::format("{}: \"function\" is {}, not an object", at, f.type_name()));
    if (!f.contains("name") || !f["name"].is_string())
      throw std::runtime_error(fmt::format("{}: no \"name\" that is a string", at));
    const auto args = f.find("arguments");
    if (args == f.end() || !(args->is_object() || args->is_string()))
      throw std::runtime_error(fmt::format("{}: \"arguments\" is {}, not an object nor a string", at,
                                           args == f.end() ? "missing" : args->type_name()));
    out.push_back({f["name"].get<std::string>(), args->is_string() ? args->get<std::string>() : python_json(*args)});
  }
  return out;
}

}  // namespace

std::vector<PromptCompletion> read_prompt_completions(std::string_view text, const std::string& path) {
  std::vector<PromptCompletion> out;
  for_each_object(text, path, "{\"prompt\": ..., \"completion\": ...}",
                  [&](const json& example, const std::string& where, std::string_view) {
                    PromptCompletion pc{text_field(example, "prompt", where), text_field(example, "completion", where)};
                    if (pc.completion.empty())
                      throw std::runtime_error(where + ": an empty \"completion\": the example would teach nothing");
                    out.push_back(std::move(pc));
                  });
  return out;
}

std::string python_json(const nlohmann::ordered_json& value) {
  if (value.is_object()) {
    std::string out = "{";
    for (auto it = value.begin(); it != value.end(); ++it) {
      if (it != value.begin()) out += ", ";
      out += nlohmann::ordered_json(it.key()).dump() + ": " + python_json(it.value());
    }
    return out + "}";
  }
  if (value.is_array()) {
    std::string out = "[";
    for (size_t i = 0; i < value.size(); ++i) out += (i ? ", " : "") + python_json(value[i]);
    return out + "]";
  }
  return value.dump();  // numbers, text (UTF-8 as it is, control characters escaped), true, false, null
}

std::vector<Conversation> read_conversations(std::string_view text, const std::string& path) {
  std::vector<Conversation> out;
  for_each_object(
      text, path, "{\"messages\": [...]}", [&](const json& example, const std::string& where, std::string_view line) {
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
        Conversation c{where, {}, {}};
        // Tool specifications and calls are written as JSON with their keys in the order given
        // (json keeps them sorted): the line again, its nesting already checked.
        std::optional<nlohmann::ordered_json> in_order;
        const auto ordered = [&]() -> const nlohmann::ordered_json& {
          if (!in_order) in_order = nlohmann::ordered_json::parse(line);
          return *in_order;
        };
        if (const auto tools = example.find("tools"); tools != example.end() && !share_gpt) {
          if (!tools->is_array())
            throw std::runtime_error(fmt::format("{}: \"tools\" is {}, not a list", where, tools->type_name()));
          for (size_t k = 0; k < tools->size(); ++k) {
            if (!(*tools)[k].is_object())
              throw std::runtime_error(
                  fmt::format("{}: tool {} is {}, not an object", where, k, (*tools)[k].type_name()));
            c.tools.push_back(python_json(ordered()["tools"][k]));
          }
        }
        bool assistant_speaks = false;
        for (size_t i = 0; i < messages->size(); ++i) {
          const json& m = (*messages)[i];
          const std::string at = fmt::format("{}: message {}", where, i);
          if (!m.is_object()) throw std::runtime_error(fmt::format("{} is {}, not an object", at, m.type_name()));
          ChatMessage message{role_named(text_field(m, role_key, at), at), {}, {}};
          const auto calls = m.find("tool_calls");
          const bool calling = calls != m.end() && !calls->is_null() && !share_gpt;
          if (calling) {
            if (message.role != ChatRole::kAssistant)
              throw std::runtime_error(at + ": \"tool_calls\" in a message that is not the assistant's");
            message.tool_calls = tool_calls_of(ordered()[list][i]["tool_calls"], at);
          }
          // An assistant's turn of tool calls alone has no content (null, or none).
          const auto content = m.find(content_key);
          if (!calling || (content != m.end() && !content->is_null()))
            message.content = message_content(m, content_key, at);
          assistant_speaks |=
              message.role == ChatRole::kAssistant && (!message.content.empty() || !message.tool_calls.empty());
          c.messages.push_back(std::move(message));
        }
        if (!assistant_speaks)
          throw std::runtime_error(
              where + ": no assistant message with content or tool calls: the conversation would teach nothing");
        out.push_back(std::move(c));
      });
  return out;
}

}  // namespace tide
