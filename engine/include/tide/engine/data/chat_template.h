// Chat templates: how a conversation becomes the text a chat model reads, and which of
// it the loss counts. Models ship theirs as Jinja in tokenizer_config.json; C++ has no
// Jinja in Debian, so tide writes the known ones out, as torchtune and llama.cpp do:
//  - llama3: <|begin_of_text|>, then each message as <|start_header_id|>ROLE
//    <|end_header_id|>\n\n CONTENT (trimmed) <|eot_id|> (Llama 3, 3.1 without its
//    default dated system message, 3.2, 3.3).
//  - chatml: <|im_start|>ROLE\n CONTENT <|im_end|>\n (Qwen 2, 2.5, 3 without a default
//    system message; SmolLM, Hermes and others), and tool use as Qwen 2.5 and 3 write it:
//    the functions in the system turn, calls in <tool_call> tags, results in
//    <tool_response> tags in a user turn. llama3 and gemma refuse tool use.
//  - gemma: <bos>, then <start_of_turn>user|model\n CONTENT (trimmed) <end_of_turn>\n,
//    a system message put before the first user message (Gemma 3's rule), and turns that
//    alternate user, model as Gemma's templates require.
// An assistant's content and its end-of-turn token count; the markup before them (the
// header a generation prompt supplies), system and user turns do not (TRL's
// assistant_only_loss, torchtune's train_on_input = false).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tide/engine/data/fine_tuning_examples.h"
#include "tide/engine/data/text_spans.h"

namespace tide {

class Tokenizer;

enum class ChatTemplate { kLlama3, kChatMl, kGemma };

// "llama3", "chatml", "gemma"; an unknown name throws std::invalid_argument listing them.
ChatTemplate chat_template_named(const std::string& name);
std::string chat_template_name(ChatTemplate t);
const std::vector<std::string>& chat_template_names();

// The special tokens the template's markup is made of: a tokenizer must encode each as
// its one id (tide adds them to the vocabularies it makes).
const std::vector<std::string>& chat_special_tokens(ChatTemplate t);

// The template whose special tokens `tokenizer` has, if one's (the first of llama3,
// chatml, gemma whose every token it has).
std::optional<ChatTemplate> chat_template_of(const Tokenizer& tokenizer);

// Throws std::runtime_error naming `tokenizer_name` and the first of the template's
// special tokens that the tokenizer does not encode as one id of its own.
void check_chat_tokens(ChatTemplate t, const Tokenizer& tokenizer, const std::string& tokenizer_name);

// The template as Jinja, for inference engines to write prompts in the format the model
// was tuned on: tide writes it as chat_template.jinja beside a dataset's tokenizer, runs
// and exports carry it with the tokenizer, and an export puts it in tokenizer_config.json
// ("chat_template"; transformers, vLLM and TGI read it). With add_generation_prompt it
// ends with the assistant's header.
const std::string& chat_template_jinja(ChatTemplate t);

// What a prompt for the assistant's next turn ends with (its header; Jinja's
// add_generation_prompt).
std::string chat_generation_prompt(ChatTemplate t);

// The token an assistant's turn ends with (<|eot_id|>, <|im_end|>, <end_of_turn>):
// where a chat reply stops.
const std::string& chat_end_of_turn(ChatTemplate t);

// The template whose Jinja (chat_template_jinja) is `jinja`, if one's.
std::optional<ChatTemplate> chat_template_of_jinja(const std::string& jinja);

// The file name it is kept under beside a tokenizer.
inline constexpr char kChatTemplateFile[] = "chat_template.jinja";

// The chat_template.jinja beside `tokenizer_path` (its text), if there is one; a file
// over 1 MiB throws, naming it.
std::optional<std::string> chat_template_beside(const std::string& tokenizer_path);

// The conversation as the template writes it, in spans that count or not. A conversation
// the template cannot write (gemma: a system message after the first, turns that do not
// alternate; llama3 and gemma: tool use) throws std::runtime_error naming its line.
std::vector<TextSpan> render_conversation(ChatTemplate t, const Conversation& conversation);

}  // namespace tide
