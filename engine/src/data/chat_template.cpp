#include "tide/engine/data/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "tide/engine/data/tokenizer.h"
#include "tide/engine/io/utf8.h"

namespace tide {
namespace {

// Python's str.isspace(), which Jinja's `trim` (str.strip) removes.
bool python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Jinja's `trim`; a byte that is not UTF-8 is no space, so trimming stops at it.
std::string trimmed(const std::string& s) {
  size_t begin = 0;
  while (begin < s.size()) {
    const Utf8Char c = utf8_char_at(s, begin);
    if (!python_space(c.code_point)) break;
    begin += c.length;
  }
  size_t end = begin;  // after the last code point that is not a space
  for (size_t i = begin; i < s.size();) {
    const Utf8Char c = utf8_char_at(s, i);
    i += c.length;
    if (!python_space(c.code_point)) end = i;
  }
  return s.substr(begin, end - begin);
}

const char* role_name(ChatRole r) {
  switch (r) {
    case ChatRole::kSystem: return "system";
    case ChatRole::kUser: return "user";
    case ChatRole::kAssistant: return "assistant";
    case ChatRole::kTool: return "tool";
  }
  throw std::logic_error("unknown chat role");
}

// llama3's and gemma's templates as tide writes them have no tool use: a conversation with
// tools, tool calls or tool messages is refused, naming the template that has it.
void check_no_tools(const Conversation& c, const char* name) {
  const auto uses_tools = [](const ChatMessage& m) { return m.role == ChatRole::kTool || !m.tool_calls.empty(); };
  if (!c.tools.empty() || std::any_of(c.messages.begin(), c.messages.end(), uses_tools))
    throw std::runtime_error(c.where + ": tools, tool calls or tool messages, which the " + name +
                             " template does not write (chatml does: Qwen 2.5 and 3, Hermes)");
}

// What each template writes before a message of `role`: its turn marker, a special
// token, first (an assistant's header is also the generation prompt).
std::string header(ChatTemplate t, ChatRole role) {
  switch (t) {
    case ChatTemplate::kLlama3: return std::string("<|start_header_id|>") + role_name(role) + "<|end_header_id|>\n\n";
    case ChatTemplate::kChatMl: return std::string("<|im_start|>") + role_name(role) + "\n";
    case ChatTemplate::kGemma:
      return std::string("<start_of_turn>") + (role == ChatRole::kUser ? "user" : "model") + "\n";
  }
  throw std::logic_error("unknown chat template");
}

// An assistant's turn: its content and end-of-turn count, the header before does not.
void add_turn(std::vector<TextSpan>& out, ChatTemplate t, ChatRole role, std::string content,
              const std::string& end_of_turn, std::string after = {}) {
  const bool counted = role == ChatRole::kAssistant;
  out.push_back({header(t, role), false, true});
  out.push_back({std::move(content) + end_of_turn, counted});
  if (!after.empty()) out.push_back({std::move(after), false});
}

std::vector<TextSpan> llama3(const Conversation& c) {
  check_no_tools(c, "llama3");
  std::vector<TextSpan> out{{"<|begin_of_text|>", false}};
  for (const auto& m : c.messages) add_turn(out, ChatTemplate::kLlama3, m.role, trimmed(m.content), "<|eot_id|>");
  return out;
}

// Tool use as Qwen 2.5 and 3 write it (Hermes' format): the functions' specifications in
// the system turn, after the system message where there is one; each call in <tool_call>
// tags after what the assistant says; consecutive tool messages in one user turn, each in
// <tool_response> tags. Unlike Qwen's, no default system message.
constexpr const char* kToolsPreamble =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
    "function signatures within <tools></tools> XML tags:\n<tools>";
constexpr const char* kToolsClosing =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>";

std::vector<TextSpan> chatml(const Conversation& c) {
  std::vector<TextSpan> out;
  size_t first = 0;
  if (!c.tools.empty()) {
    std::string system;
    if (!c.messages.empty() && c.messages[0].role == ChatRole::kSystem) {
      system = c.messages[0].content + "\n\n";
      first = 1;
    }
    system += kToolsPreamble;
    for (const auto& tool : c.tools) system += "\n" + tool;
    add_turn(out, ChatTemplate::kChatMl, ChatRole::kSystem, system + kToolsClosing, "<|im_end|>", "\n");
  }
  for (size_t i = first; i < c.messages.size(); ++i) {
    const ChatMessage& m = c.messages[i];
    if (m.role == ChatRole::kTool) {
      const bool opens = i == 0 || c.messages[i - 1].role != ChatRole::kTool;
      const bool closes = i + 1 == c.messages.size() || c.messages[i + 1].role != ChatRole::kTool;
      if (opens) out.push_back({"<|im_start|>user", false, true});
      out.push_back({"\n<tool_response>\n" + m.content + "\n</tool_response>" + (closes ? "<|im_end|>\n" : ""), false});
      continue;
    }
    std::string said = m.content;
    for (size_t k = 0; k < m.tool_calls.size(); ++k) {
      const ToolCall& call = m.tool_calls[k];
      said += (k > 0 || !m.content.empty() ? "\n" : "") + std::string("<tool_call>\n{\"name\": \"") + call.name +
              "\", \"arguments\": " + call.arguments + "}\n</tool_call>";
    }
    add_turn(out, ChatTemplate::kChatMl, m.role, said, "<|im_end|>", "\n");
  }
  return out;
}

std::vector<TextSpan> gemma(const Conversation& c) {
  check_no_tools(c, "gemma");
  std::vector<TextSpan> out{{"<bos>", false}};
  size_t first = 0;
  std::string system_prefix;
  if (!c.messages.empty() && c.messages[0].role == ChatRole::kSystem) {
    system_prefix = c.messages[0].content + "\n\n";
    first = 1;
  }
  for (size_t i = first; i < c.messages.size(); ++i) {
    const ChatMessage& m = c.messages[i];
    const bool user_turn = (i - first) % 2 == 0;
    if (m.role == ChatRole::kSystem)
      throw std::runtime_error(c.where + ": message " + std::to_string(i) +
                               " is a system message after the first: the gemma template takes one, first");
    if ((m.role == ChatRole::kUser) != user_turn)
      throw std::runtime_error(c.where + ": message " + std::to_string(i) + " is " + role_name(m.role) +
                               "'s turn: the gemma template's turns alternate user, assistant, starting with user");
    const std::string content = (i == first ? system_prefix : std::string()) + trimmed(m.content);
    add_turn(out, ChatTemplate::kGemma, m.role, content, "<end_of_turn>", "\n");
  }
  return out;
}

struct Known {
  ChatTemplate kind;
  const char* name;
  std::vector<std::string> tokens;  // the end-of-turn token last
  std::string jinja;  // what the functions above write, for engines that read Jinja
  // The Jinja earlier versions of tide wrote for the same template, oldest first, which
  // chat_template_of_jinja still knows (runs prepared then keep their template).
  std::vector<std::string> earlier = {};
};

// What the exported templates read a message's content through: a string, or OpenAI's
// list of parts, whose texts are joined as the data was (fine_tuning_examples.h).
constexpr const char* kContentText =
    "{%- macro text(content) %}{%- if content is string %}{{- content }}{%- else %}"
    "{%- for part in content %}{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}"
    "{%- endif %}{%- endmacro %}";

const std::vector<Known>& known() {
  static const std::vector<Known> k = {
      {ChatTemplate::kLlama3,
       "llama3",
       {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
       kContentText + std::string("{{- '<|begin_of_text|>' }}"
                                  "{%- for message in messages %}"
                                  "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + "
                                  "text(message['content']) | trim + "
                                  "'<|eot_id|>' }}"
                                  "{%- endfor %}"
                                  "{%- if add_generation_prompt %}{{- "
                                  "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}")},
      {ChatTemplate::kChatMl,
       "chatml",
       {"<|im_start|>", "<|im_end|>"},
       kContentText +
           std::string("{%- if tools %}"
                       "{{- '<|im_start|>system\n' }}"
                       "{%- if messages[0]['role'] == 'system' %}"
                       "{{- text(messages[0]['content']) + '\n\n' }}{%- endif %}"
                       "{{- '") +
           kToolsPreamble +
           "' }}"
           "{%- for tool in tools %}{{- '\n' + (tool | tojson) }}{%- endfor %}"
           "{{- '" +
           kToolsClosing +
           "<|im_end|>\n' }}"
           "{%- endif %}"
           "{%- for message in messages %}"
           "{%- if message['role'] == 'system' and loop.first and tools %}"
           "{%- elif message['role'] == 'tool' %}"
           "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
           "{{- '\n<tool_response>\n' + text(message['content']) + '\n</tool_response>' }}"
           "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}"
           "{%- elif message['role'] == 'assistant' and message['tool_calls'] %}"
           "{%- set content = text(message['content']) if message['content'] else '' %}"
           "{{- '<|im_start|>assistant\n' + content }}"
           "{%- for call in message['tool_calls'] %}"
           "{%- set f = call['function'] if call['function'] is defined else call %}"
           "{%- if not loop.first or content %}{{- '\n' }}{%- endif %}"
           "{{- '<tool_call>\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
           "{%- if f['arguments'] is string %}{{- f['arguments'] }}{%- else %}{{- f['arguments'] | tojson }}{%- endif "
           "%}"
           "{{- '}\n</tool_call>' }}"
           "{%- endfor %}"
           "{{- '<|im_end|>\n' }}"
           "{%- else %}"
           "{{- '<|im_start|>' + message['role'] + '\n' + text(message['content']) + '<|im_end|>' + '\n' }}"
           "{%- endif %}"
           "{%- endfor %}"
           "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}",
       {kContentText +
        std::string("{%- for message in messages %}"
                    "{{- '<|im_start|>' + message['role'] + '\n' + text(message['content']) + '<|im_end|>' + '\n' }}"
                    "{%- endfor %}"
                    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}")}},
      {ChatTemplate::kGemma,
       "gemma",
       {"<bos>", "<start_of_turn>", "<end_of_turn>"},
       kContentText +
           std::string("{{- '<bos>' }}"
                       "{%- if messages[0]['role'] == 'system' %}"
                       "{%- set first_user_prefix = text(messages[0]['content']) + '\n\n' %}{%- set loop_messages = "
                       "messages[1:] %}"
                       "{%- else %}{%- set first_user_prefix = '' %}{%- set loop_messages = messages %}{%- endif %}"
                       "{%- for message in loop_messages %}"
                       "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                       "{{- raise_exception('turns must alternate user, assistant, starting with user') }}{%- endif %}"
                       "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
                       "{{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') + "
                       "text(message['content']) | trim + "
                       "'<end_of_turn>\n' }}"
                       "{%- endfor %}"
                       "{%- if add_generation_prompt %}{{- '<start_of_turn>model\n' }}{%- endif %}")},
  };
  return k;
}

const Known& known(ChatTemplate t) {
  for (const auto& k : known())
    if (k.kind == t) return k;
  throw std::logic_error("unknown chat template");
}

// The first of `tokens` that `tokenizer` does not encode as one id standing for it.
const std::string* missing_token(const std::vector<std::string>& tokens, const Tokenizer& tokenizer) {
  for (const auto& t : tokens) {
    const auto ids = tokenizer.encode(t);
    if (ids.size() != 1 || tokenizer.token_text(ids[0]) != t) return &t;
  }
  return nullptr;
}

}  // namespace

ChatTemplate chat_template_named(const std::string& name) {
  for (const auto& k : known())
    if (name == k.name) return k.kind;
  throw std::invalid_argument("chat template '" + name + "' is none of llama3, chatml, gemma");
}

std::string chat_template_name(ChatTemplate t) { return known(t).name; }

const std::vector<std::string>& chat_template_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& k : known()) n.emplace_back(k.name);
    return n;
  }();
  return names;
}

const std::vector<std::string>& chat_special_tokens(ChatTemplate t) { return known(t).tokens; }

const std::string& chat_template_jinja(ChatTemplate t) { return known(t).jinja; }

std::string chat_generation_prompt(ChatTemplate t) { return header(t, ChatRole::kAssistant); }

const std::string& chat_end_of_turn(ChatTemplate t) { return known(t).tokens.back(); }

std::optional<std::string> chat_template_beside(const std::string& tokenizer_path) {
  if (tokenizer_path.empty()) return std::nullopt;
  const std::filesystem::path file = std::filesystem::path(tokenizer_path).parent_path() / kChatTemplateFile;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec)) return std::nullopt;
  if (std::filesystem::file_size(file) > (1u << 20))
    throw std::runtime_error(file.string() + " is larger than 1 MiB: not a chat template");
  std::ifstream in(file, std::ios::binary);
  std::string text(std::istreambuf_iterator<char>(in), {});
  if (!in.good() && !in.eof()) throw std::runtime_error("cannot read " + file.string());
  return text;
}

namespace {
// A template as tide wrote it before content could be a list of parts (December 2026):
// the same text with the content read as it is. Runs prepared then keep working.
std::string jinja_of_string_content(const std::string& jinja) {
  std::string out = jinja.substr(std::string(kContentText).size());
  for (const std::string call : {"text(message['content'])", "text(messages[0]['content'])"}) {
    const std::string plain = call.substr(5, call.size() - 6);
    for (size_t at = out.find(call); at != std::string::npos; at = out.find(call, at + plain.size()))
      out.replace(at, call.size(), plain);
  }
  return out;
}
}  // namespace

std::optional<ChatTemplate> chat_template_of_jinja(const std::string& jinja) {
  for (const auto& k : known()) {
    if (k.jinja == jinja || std::find(k.earlier.begin(), k.earlier.end(), jinja) != k.earlier.end()) return k.kind;
    if (jinja_of_string_content(k.earlier.empty() ? k.jinja : k.earlier.front()) == jinja) return k.kind;
  }
  return std::nullopt;
}

std::optional<ChatTemplate> chat_template_of(const Tokenizer& tokenizer) {
  for (const auto& k : known())
    if (!missing_token(k.tokens, tokenizer)) return k.kind;
  return std::nullopt;
}

void check_chat_tokens(ChatTemplate t, const Tokenizer& tokenizer, const std::string& tokenizer_name) {
  if (const std::string* token = missing_token(known(t).tokens, tokenizer))
    throw std::runtime_error("tokenizer '" + tokenizer_name + "' has no special token " + *token + " for the " +
                             known(t).name + " chat template (it would be split into pieces of text)");
}

std::vector<TextSpan> render_conversation(ChatTemplate t, const Conversation& conversation) {
  switch (t) {
    case ChatTemplate::kLlama3: return llama3(conversation);
    case ChatTemplate::kChatMl: return chatml(conversation);
    case ChatTemplate::kGemma: return gemma(conversation);
  }
  throw std::logic_error("unknown chat template");
}

}  // namespace tide
