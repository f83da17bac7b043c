// Fine-tuning examples, one JSON object a line, in the two forms Hugging Face TRL and
// torchtune read:
//  - prompt-completion (`tide data prepare --format prompt-completion`):
//    {"prompt": "...", "completion": "..."}; the prompt's tokens become inputs only, the
//    completion's (and its end-of-text) the targets the loss counts.
//  - conversations (`--format messages`): {"messages": [{"role": "user", "content": "..."},
//    ...]} (OpenAI's form) or {"conversations": [{"from": "human", "value": "..."}, ...]}
//    (ShareGPT's); a chat template (chat_template.h) renders them and counts the
//    assistant's turns only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tide {

struct PromptCompletion {
  std::string prompt, completion;
};

// The examples of `text`, the contents of the file `path`, in order; blank lines are
// skipped, other fields of an object ignored. A line that is not such an object (not
// JSON, nested deeper than 64, "prompt" or "completion" missing or not a string, or a
// completion that is empty) throws, naming the file, the line and what is wrong.
std::vector<PromptCompletion> read_prompt_completions(std::string_view text, const std::string& path);

enum class ChatRole { kSystem, kUser, kAssistant };

struct ChatMessage {
  ChatRole role;
  std::string content;
};

struct Conversation {
  std::string where;  // "file:line", for errors found after reading (a template's rules)
  std::vector<ChatMessage> messages;
};

// The conversations of `text`, the contents of the file `path`, in order; blank lines are
// skipped. Roles are "system", "user" and "assistant" (ShareGPT's "system", "human" and
// "gpt" too); content is a string, or OpenAI's list of parts ({"type": "text", "text"}),
// whose texts are joined with no separator. A line that is not such an object, a message
// of another role or with other content (null, an image part), or a conversation with no
// assistant turn that says something, throws, naming the file, the line and what is wrong.
std::vector<Conversation> read_conversations(std::string_view text, const std::string& path);

}  // namespace tide
