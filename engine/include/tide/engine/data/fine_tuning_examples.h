// Fine-tuning examples, one JSON object a line, in the two forms Hugging Face TRL and
// torchtune read:
//  - prompt-completion (`tide data prepare --format prompt-completion`):
//    {"prompt": "...", "completion": "..."}; the prompt's tokens become inputs only, the
//    completion's (and its end-of-text) the targets the loss counts.
//  - conversations (`--format messages`): {"messages": [{"role": "user", "content": "..."},
//    ...]} (OpenAI's form) or {"conversations": [{"from": "human", "value": "..."}, ...]}
//    (ShareGPT's); a chat template (chat_template.h) renders them and counts the
//    assistant's turns only. OpenAI's form may carry tool use: "tools" (the functions'
//    specifications) beside "messages", an assistant's "tool_calls", and "tool" messages
//    with what a call returned.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tide {

struct PromptCompletion {
  std::string prompt, completion;
};

// The examples of `text`, the contents of the file `path`, in order; blank lines are
// skipped, other fields of an object ignored. A line that is not such an object (not
// JSON, nested deeper than 64, "prompt" or "completion" missing or not a string, or a
// completion that is empty) throws, naming the file, the line and what is wrong.
std::vector<PromptCompletion> read_prompt_completions(std::string_view text, const std::string& path);

enum class ChatRole { kSystem, kUser, kAssistant, kTool };

// A function an assistant calls: its name and its arguments as the template writes them
// (an object as Python's json.dumps writes it, which is what chat templates' `tojson`
// gives; a string, OpenAI's form, as it is).
struct ToolCall {
  std::string name, arguments;
};

struct ChatMessage {
  ChatRole role;
  std::string content;  // empty for an assistant's turn of tool calls alone
  std::vector<ToolCall> tool_calls;
};

struct Conversation {
  std::string where;  // "file:line", for errors found after reading (a template's rules)
  std::vector<ChatMessage> messages;
  std::vector<std::string> tools;  // each function's specification, as json.dumps writes it
};

// `value` as Python's json.dumps(value, ensure_ascii=False) writes it: ", " and ": "
// between items, keys in the order given, text as it is. Chat templates write JSON
// through that (transformers' `tojson`).
std::string python_json(const nlohmann::ordered_json& value);

// The conversations of `text`, the contents of the file `path`, in order; blank lines are
// skipped. Roles are "system", "user", "assistant" and "tool" (ShareGPT's "system",
// "human" and "gpt" too); content is a string, or OpenAI's list of parts ({"type":
// "text", "text"}), whose texts are joined with no separator; an assistant's turn may
// instead (or also) hold "tool_calls", each {"function": {"name", "arguments"}} (or the
// function's fields alone), arguments an object or a string. A line that is not such an
// object, a message of another role or with other content (null, an image part), a tool
// call without a name or arguments, "tools" that is not a list of objects, or a
// conversation with no assistant turn that says or calls something, throws, naming the
// file, the line and what is wrong.
std::vector<Conversation> read_conversations(std::string_view text, const std::string& path);

}  // namespace tide
