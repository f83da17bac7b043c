// Chat templates (chat_template.h): the text each writes, the ids and loss mask of a
// conversation against Hugging Face transformers' apply_chat_template with the same
// format as Jinja (tests/engine/hf_chat.py, in the project's .venv), and the errors.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "command_output.h"
#include "tide/engine/data/chat_template.h"
#include "tide/engine/data/fine_tuning_examples.h"
#include "tide/engine/data/text_spans.h"
#include "tide/engine/data/tokenizer.h"

namespace tide {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

Conversation conversation(const json& messages) {
  return read_conversations(json{{"messages", messages}}.dump(), "test.jsonl").at(0);
}

json message(const char* role, const std::string& content) { return {{"role", role}, {"content", content}}; }
json text_part(const std::string& text) { return {{"type", "text"}, {"text", text}}; }

// Spaces around contents (the templates that trim, and Python's Unicode spaces: U+00A0,
// U+3000), a content that starts with spaces where a header ends (a merge across the
// edge), an assistant turn with nothing to say, tabs, digits, line ends.
const json kConversations = json::array({
    json::array({message("system", " You are terse. "), message("user", "What is 2+2?"), message("assistant", "4"),
                 message("user", "  And 3+3?\n"), message("assistant", " 6 ")}),
    json::array({message("user", "caf\xC3\xA9\xC2\xA0"),
                 message("assistant", "\xE3\x80\x80na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 \xE2\x80\x94 fine\n\n")}),
    json::array({message("user", "Hello"), message("assistant", "  leading spaces, then words")}),
    json::array({message("user", "x"), message("assistant", ""), message("user", "y"), message("assistant", "z")}),
    json::array({message("user", "Numbers 12345 and\ttabs"), message("assistant", "new\nlines\r\n and trailing   ")}),
    // ChatML keeps the line ends a content starts with: "\n\n" is one token of tide's
    // vocabulary, crossing the edge from the header.
    json::array({message("user", "a"), message("assistant", "\n\nParagraphs\n\nof text")}),
    // OpenAI's content parts: their texts joined as written, then trimmed where the
    // template trims.
    json::array({{{"role", "system"}, {"content", json::array({text_part(" Be "), text_part("brief. ")})}},
                 {{"role", "user"}, {"content", json::array({text_part("Two"), text_part(" parts")})}},
                 {{"role", "assistant"}, {"content", json::array({text_part(" One,"), text_part(" then two ")})}}}),
});

TEST(ChatTemplate, WritesEachTemplatesText) {
  const Conversation c = conversation(kConversations[0]);
  auto text = [&](ChatTemplate t, bool counted) {
    std::string s;
    for (const auto& span : render_conversation(t, c))
      if (span.counted == counted) s += span.text + "|";
    return s;
  };
  EXPECT_EQ(text(ChatTemplate::kLlama3, true), "4<|eot_id|>|6<|eot_id|>|");
  EXPECT_EQ(text(ChatTemplate::kLlama3, false),
            "<|begin_of_text|>|<|start_header_id|>system<|end_header_id|>\n\n|You are terse.<|eot_id|>|"
            "<|start_header_id|>user<|end_header_id|>\n\n|What is 2+2?<|eot_id|>|"
            "<|start_header_id|>assistant<|end_header_id|>\n\n|<|start_header_id|>user<|end_header_id|>\n\n|"
            "And 3+3?<|eot_id|>|<|start_header_id|>assistant<|end_header_id|>\n\n|");
  EXPECT_EQ(text(ChatTemplate::kChatMl, true), "4<|im_end|>| 6 <|im_end|>|");
  EXPECT_EQ(text(ChatTemplate::kChatMl, false),
            "<|im_start|>system\n| You are terse. <|im_end|>|\n|<|im_start|>user\n|What is 2+2?<|im_end|>|\n|"
            "<|im_start|>assistant\n|\n|<|im_start|>user\n|  And 3+3?\n<|im_end|>|\n|<|im_start|>assistant\n|\n|");
  // Gemma: the system message before the first user turn's text, the assistant a "model".
  EXPECT_EQ(text(ChatTemplate::kGemma, true), "4<end_of_turn>|6<end_of_turn>|");
  EXPECT_EQ(text(ChatTemplate::kGemma, false),
            "<bos>|<start_of_turn>user\n| You are terse. \n\nWhat is 2+2?<end_of_turn>|\n|<start_of_turn>model\n|\n|"
            "<start_of_turn>user\n|And 3+3?<end_of_turn>|\n|<start_of_turn>model\n|\n|");
}

TEST(ChatTemplate, GemmaTakesOneSystemMessageFirstAndAlternatingTurns) {
  auto error = [](const json& messages) {
    try {
      render_conversation(ChatTemplate::kGemma, conversation(messages));
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error(json::array({message("user", "a"), message("user", "b"), message("assistant", "c")})),
            "test.jsonl:1: message 1 is user's turn: the gemma template's turns alternate user, assistant, starting "
            "with user");
  EXPECT_EQ(error(json::array({message("assistant", "a")})),
            "test.jsonl:1: message 0 is assistant's turn: the gemma template's turns alternate user, assistant, "
            "starting with user");
  EXPECT_EQ(error(json::array({message("user", "a"), message("system", "b"), message("assistant", "c")})),
            "test.jsonl:1: message 1 is a system message after the first: the gemma template takes one, first");
  // The others write any order, as their templates do.
  EXPECT_NO_THROW(render_conversation(ChatTemplate::kChatMl,
                                      conversation(json::array({message("assistant", "a"), message("system", "b")}))));
}

// A run prepared before content could be a list of parts holds the template as tide wrote
// it then: still known, so `tide generate --chat` needs no template named.
TEST(ChatTemplate, ATemplateWrittenBeforeContentPartsIsKnown) {
  const std::string chatml_then =
      "{%- for message in messages %}"
      "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
      "{%- endfor %}"
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}";
  EXPECT_EQ(chat_template_of_jinja(chatml_then), ChatTemplate::kChatMl);
  // and as tide wrote it after content parts and before tool use (session 64).
  const std::string chatml_parts =
      "{%- macro text(content) %}{%- if content is string %}{{- content }}{%- else %}"
      "{%- for part in content %}{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}{%- endfor %}"
      "{%- endif %}{%- endmacro %}" +
      chatml_then.substr(0, chatml_then.find("message['content']")) + "text(message['content'])" +
      chatml_then.substr(chatml_then.find("message['content']") + std::string("message['content']").size());
  EXPECT_EQ(chat_template_of_jinja(chatml_parts), ChatTemplate::kChatMl);
  EXPECT_EQ(chat_template_of_jinja(chat_template_jinja(ChatTemplate::kChatMl)), ChatTemplate::kChatMl);
  EXPECT_EQ(chat_template_of_jinja(chatml_then + " "), std::nullopt);
}

TEST(ChatTemplate, NamesAndSpecialTokens) {
  EXPECT_EQ(chat_template_named("chatml"), ChatTemplate::kChatMl);
  EXPECT_EQ(chat_template_name(ChatTemplate::kGemma), "gemma");
  try {
    chat_template_named("vicuna");
    ADD_FAILURE() << "an unknown template was named";
  } catch (const std::invalid_argument& e) {
    EXPECT_STREQ(e.what(), "chat template 'vicuna' is none of llama3, chatml, gemma");
  }
  ByteLevelBpe bytes = ByteLevelBpe::bytes();
  EXPECT_FALSE(chat_template_of(bytes).has_value());
  try {
    check_chat_tokens(ChatTemplate::kGemma, bytes, "bytes");
    ADD_FAILURE() << "a tokenizer without gemma's tokens passed";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(),
                 "tokenizer 'bytes' has no special token <bos> for the gemma chat template (it would be split into "
                 "pieces of text)");
  }
  bytes.add_special_tokens(chat_special_tokens(ChatTemplate::kGemma));
  bytes.add_special_tokens(chat_special_tokens(ChatTemplate::kGemma));  // present already: nothing added
  EXPECT_EQ(bytes.vocab_size(), 257 + 3);
  EXPECT_EQ(chat_template_of(bytes), ChatTemplate::kGemma);
  EXPECT_NO_THROW(check_chat_tokens(ChatTemplate::kGemma, bytes, "bytes"));
  EXPECT_EQ(bytes.encode("<start_of_turn>user"), (std::vector<int32_t>{258, 'u', 's', 'e', 'r'}));
}

// A conversation line that is not one names the file, the line and what is wrong.
TEST(FineTuningExamples, AConversationThatIsNotOneIsNamed) {
  auto error = [](const std::string& line) {
    try {
      read_conversations("\n" + line + "\n", "chat.jsonl");
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("{\"prompt\": \"a\"}"), "chat.jsonl:2: no \"messages\" (nor ShareGPT's \"conversations\")");
  EXPECT_EQ(error("{\"messages\": {}}"), "chat.jsonl:2: \"messages\" is object, not a list of messages");
  EXPECT_EQ(error("{\"messages\": [3]}"), "chat.jsonl:2: message 0 is number, not an object");
  EXPECT_EQ(error("{\"messages\": [{\"role\": \"ipython\", \"content\": \"x\"}]}"),
            "chat.jsonl:2: message 0: role \"ipython\" is none of system, user, assistant, tool (ShareGPT's human, "
            "gpt)");
  EXPECT_EQ(error(R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})"),
            "chat.jsonl:2: message 0: \"tool_calls\" in a message that is not the assistant's");
  EXPECT_EQ(error(R"({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]})"),
            "chat.jsonl:2: message 0 tool call 0: \"arguments\" is missing, not an object nor a string");
  EXPECT_EQ(error(R"({"messages": [{"role": "assistant", "tool_calls": [{"arguments": {}}]}]})"),
            "chat.jsonl:2: message 0 tool call 0: no \"name\" that is a string");
  EXPECT_EQ(error(R"({"messages": [{"role": "assistant", "tool_calls": {}}]})"),
            "chat.jsonl:2: message 0: \"tool_calls\" is object, not a list");
  EXPECT_EQ(error(R"({"tools": {}, "messages": [{"role": "assistant", "content": "a"}]})"),
            "chat.jsonl:2: \"tools\" is object, not a list");
  EXPECT_EQ(error(R"({"tools": [1], "messages": [{"role": "assistant", "content": "a"}]})"),
            "chat.jsonl:2: tool 0 is number, not an object");
  EXPECT_EQ(error(R"({"messages": [{"role": "assistant", "content": null}]})"),
            "chat.jsonl:2: message 0: \"content\" is null, not a string nor a list of parts");
  EXPECT_EQ(error("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}"),
            "chat.jsonl:2: message 0 part 0: no \"text\"");
  EXPECT_EQ(
      error("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\", \"image_url\": {}}]}]}"),
      "chat.jsonl:2: message 0 part 0 is of type \"image_url\": tide trains on text parts alone");
  EXPECT_EQ(error("{\"messages\": [{\"role\": \"user\", \"content\": [\"hi\"]}]}"),
            "chat.jsonl:2: message 0 part 0 is string, not an object");
  EXPECT_EQ(error("{\"messages\": [{\"role\": \"user\", \"content\": 7}]}"),
            "chat.jsonl:2: message 0: \"content\" is number, not a string nor a list of parts");
  EXPECT_EQ(error("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                  "\"content\": \"\"}]}"),
            "chat.jsonl:2: no assistant message with content or tool calls: the conversation would teach nothing");
  EXPECT_EQ(error("[1]"), "chat.jsonl:2: [1] is not an object {\"messages\": [...]}");
  EXPECT_NE(error("{\"messages\": [").find("chat.jsonl:2"), std::string::npos);  // not JSON
  // ShareGPT's form reads as OpenAI's.
  const auto c = read_conversations(
      R"({"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]})",
      "chat.jsonl");
  ASSERT_EQ(c.size(), 1u);
  ASSERT_EQ(c[0].messages.size(), 3u);
  EXPECT_EQ(c[0].messages[1].role, ChatRole::kUser);
  EXPECT_EQ(c[0].messages[2].role, ChatRole::kAssistant);
  EXPECT_EQ(c[0].messages[2].content, "a");
  EXPECT_EQ(c[0].where, "chat.jsonl:1");
}

// Tool use in OpenAI's form: the functions' specifications and each call's arguments
// written as Python's json.dumps writes them (keys in the order given, ", " and ": ",
// text as it is), arguments given as a string kept as they are; chatml writes them as
// Qwen 2.5 and 3 do, and the templates without tool use refuse them.
TEST(FineTuningExamples, ToolCallsAndResultsAreReadAndChatMlWritesThem) {
  const std::string line =
      R"({"tools": [{"type": "function", "function": {"name": "add", "parameters": {"z": 1, "a": [true, null, 2.5]}}}],)"
      R"( "messages": [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "2+2, caf\u00e9?"},)"
      R"( {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "add",)"
      R"( "arguments": {"y": 2, "x": "\u00e9\n"}}}, {"name": "mul", "arguments": "{\"a\":1}"}]},)"
      R"( {"role": "tool", "content": "4"}, {"role": "tool", "content": "1"},)"
      R"( {"role": "assistant", "content": "4", "tool_calls": [{"name": "f", "arguments": {}}]}]})";
  const auto c = read_conversations(line, "tools.jsonl");
  ASSERT_EQ(c.size(), 1u);
  ASSERT_EQ(c[0].tools.size(), 1u);
  EXPECT_EQ(c[0].tools[0],
            R"({"type": "function", "function": {"name": "add", "parameters": {"z": 1, "a": [true, null, 2.5]}}})");
  ASSERT_EQ(c[0].messages.size(), 6u);
  const ChatMessage& calls = c[0].messages[2];
  EXPECT_EQ(calls.content, "");
  ASSERT_EQ(calls.tool_calls.size(), 2u);
  EXPECT_EQ(calls.tool_calls[0].name, "add");
  EXPECT_EQ(calls.tool_calls[0].arguments, "{\"y\": 2, \"x\": \"\xC3\xA9\\n\"}");
  EXPECT_EQ(calls.tool_calls[1].arguments, "{\"a\":1}");
  EXPECT_EQ(c[0].messages[3].role, ChatRole::kTool);

  std::string counted, markup;
  for (const auto& span : render_conversation(ChatTemplate::kChatMl, c[0]))
    (span.counted ? counted : markup) += span.text;
  EXPECT_EQ(counted,
            "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"y\": 2, \"x\": \"\xC3\xA9\\n\"}}\n</tool_call>\n"
            "<tool_call>\n{\"name\": \"mul\", \"arguments\": {\"a\":1}}\n</tool_call><|im_end|>"
            "4\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call><|im_end|>");
  EXPECT_EQ(markup,
            "<|im_start|>system\nBe exact.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
            "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n" +
                c[0].tools[0] +
                "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\n2+2, caf\xC3\xA9?<|im_end|>\n"
                "<|im_start|>assistant\n\n<|im_start|>user\n<tool_response>\n4\n</tool_response>\n<tool_response>\n1\n"
                "</tool_response><|im_end|>\n<|im_start|>assistant\n\n");
  for (const ChatTemplate t : {ChatTemplate::kLlama3, ChatTemplate::kGemma}) {
    try {
      render_conversation(t, c[0]);
      ADD_FAILURE() << chat_template_name(t) << " wrote tool use";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), "tools.jsonl:1: tools, tool calls or tool messages, which the " +
                                           chat_template_name(t) +
                                           " template does not write (chatml does: Qwen 2.5 and 3, Hermes)");
    }
  }
}

// A token that crosses an edge between spans goes with the span after it; one that the
// pre-tokenizer's look-ahead past the edge changed, too.
TEST(EncodeSpans, ATokenAcrossAnEdgeGoesWithTheSpanAfterIt) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  tokens.emplace_back("ab");
  tokens.emplace_back("  ");
  const ByteLevelBpe tok(tokens, {{'a', 'b'}, {' ', ' '}}, {"<|endoftext|>"});
  const int32_t ab = 256;
  CountedIds r = encode_spans(tok, {{"xa", false}, {"by", true}, {"z", false}});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{'x', ab, 'y', 'z'}));
  EXPECT_EQ(r.counted, (std::vector<uint8_t>{0, 1, 1, 0}));
  r = encode_spans(tok, {{"xa", true}, {"by", false}});
  EXPECT_EQ(r.counted, (std::vector<uint8_t>{1, 0, 0}));
  // GPT-2's pre-tokenizer splits "c  d" as "c", " ", " d" but "c  " as "c", "  " (one
  // id): the first space, wholly before the edge, goes after it.
  r = encode_spans(tok, {{"c  ", false}, {"d", true}});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{'c', ' ', ' ', 'd'}));
  EXPECT_EQ(r.counted, (std::vector<uint8_t>{0, 1, 1, 1}));
  // Spans that count alike are one run; empty spans change nothing.
  r = encode_spans(tok, {{"", true}, {"x", false}, {"", false}, {"a", false}, {"b", true}, {"", true}});
  EXPECT_EQ(r.ids, (std::vector<int32_t>{'x', ab}));
  EXPECT_EQ(r.counted, (std::vector<uint8_t>{0, 1}));
}

// A tokenizer that counts the bytes it is given to encode (the real byte tokenizer does the
// encoding).
class CountingTokenizer : public Tokenizer {
 public:
  explicit CountingTokenizer(const ByteLevelBpe& t) : t_(t) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    bytes += text.size();
    return t_.encode(text);
  }
  std::string decode_one(int32_t id) const override { return t_.decode_one(id); }
  int64_t vocab_size() const override { return t_.vocab_size(); }
  int32_t eos_id() const override { return t_.eos_id(); }
  int32_t bos_id() const override { return t_.bos_id(); }
  std::string token_text(int32_t id) const override { return t_.token_text(id); }
  std::string file_name() const override { return t_.file_name(); }
  void save(const std::string& path) const override { t_.save(path); }
  mutable size_t bytes = 0;

 private:
  const ByteLevelBpe& t_;
};

// The edges of a long conversation are found turn by turn: the work is a few encodings of
// the conversation, not one of it for each of its turns; the ids are the whole's.
TEST(EncodeSpans, ALongConversationCostsAFewEncodingsOfIt) {
  ByteLevelBpe bytes = ByteLevelBpe::bytes();
  bytes.add_special_tokens(chat_special_tokens(ChatTemplate::kChatMl));
  json messages = json::array();
  for (int i = 0; i < 2000; ++i) {
    messages.push_back(message("user", "question " + std::to_string(i)));
    messages.push_back(message("assistant", "answer " + std::to_string(i)));
  }
  const auto spans = render_conversation(ChatTemplate::kChatMl, conversation(messages));
  std::string text;
  for (const auto& s : spans) text += s.text;
  const CountingTokenizer counting(bytes);
  const CountedIds r = encode_spans(counting, spans);
  EXPECT_EQ(r.ids, bytes.encode(text));
  EXPECT_LE(counting.bytes, 3 * text.size());
  std::ptrdiff_t said = 0;  // byte ids: each answer's bytes and its <|im_end|>
  for (int i = 0; i < 2000; ++i) said += static_cast<std::ptrdiff_t>(("answer " + std::to_string(i)).size()) + 1;
  EXPECT_EQ(std::count(r.counted.begin(), r.counted.end(), 1), said);
}

class ChatTemplateReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("tide_chat_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ifstream in("/usr/share/common-licenses/GPL-3");
    std::stringstream corpus;
    corpus << in.rdbuf() << "\n12345 What is 2+2? 6 caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 fine\n";
    std::ofstream(dir_ / "corpus.txt") << corpus.str();
    // The tokenizers library's own layouts (LLaMA 3's special tokens first, Qwen2's after
    // the vocabulary), and a vocabulary tide trains with a template's tokens added.
    for (const char* layout : {"llama3", "qwen2"}) {
      const std::string cmd = std::string(TIDE_PYTHON) + " " + TIDE_SOURCE_DIR + "/tests/engine/hf_train_bpe.py " +
                              layout + " " + (dir_ / "corpus.txt").string() + " 700 " +
                              (dir_ / (std::string("hf-") + layout + ".json")).string();
      if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << "the tokenizers library did not train: " << cmd;
    }
    for (const ChatTemplate t : {ChatTemplate::kGemma, ChatTemplate::kChatMl}) {
      ByteLevelBpe tok = train_bpe({corpus.str()}, 700);
      tok.add_special_tokens(chat_special_tokens(t));
      tok.save((dir_ / ("tide-" + chat_template_name(t) + ".json")).string());
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // transformers' ids and masks for `lines` (conversations, one JSON object each) by the
  // test's template of `t`, and its ids and last turns' prompts by tide's template as
  // exported (`exported`).
  static json reference(ChatTemplate t, const fs::path& tokenizer, const fs::path& exported,
                        const std::vector<std::string>& lines) {
    std::string array = "[";
    for (const auto& line : lines) array += (array.size() > 1 ? "," : "") + line;
    std::ofstream(dir_ / "conversations.json") << array << "]";
    const std::string cmd = std::string(TIDE_PYTHON) + " " + TIDE_SOURCE_DIR + "/tests/engine/hf_chat.py " +
                            chat_template_name(t) + " " + tokenizer.string() + " " + exported.string() + " < " +
                            (dir_ / "conversations.json").string() + " 2>&1";
    const std::string out = testing::command_output(cmd);
    const json j = json::parse(out, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ADD_FAILURE() << "transformers did not run (scripts/setup.sh installs it into .venv): " << out;
      return {};
    }
    return j;
  }

  // kConversations, or conversations given as lines of a file.
  static void check(ChatTemplate t, const std::string& tokenizer_file, std::vector<std::string> lines = {}) {
    if (lines.empty())
      for (const auto& m : kConversations) lines.push_back(json{{"messages", m}}.dump());
    const fs::path path = dir_ / tokenizer_file;
    const auto tok = load_tokenizer(path.string());
    EXPECT_EQ(chat_template_of(*tok), t) << tokenizer_file;
    // tide's template as it exports it, rendered by transformers: the same ids, and the
    // prompt for a last turn is the conversation before it and the assistant's header.
    const fs::path jinja = dir_ / (chat_template_name(t) + ".jinja");
    std::ofstream(jinja) << chat_template_jinja(t);
    const json ref = reference(t, path, jinja, lines);
    ASSERT_TRUE(ref.contains("prompt_ids"));
    for (size_t i = 0; i < lines.size(); ++i) {
      const Conversation c = read_conversations(lines[i], "test.jsonl").at(0);
      const CountedIds ours = encode_spans(*tok, render_conversation(t, c));
      EXPECT_EQ(ours.ids, ref["ids"][i].get<std::vector<int32_t>>()) << tokenizer_file << " conversation " << i;
      EXPECT_EQ(ours.counted, ref["masks"][i].get<std::vector<uint8_t>>()) << tokenizer_file << " conversation " << i;
      EXPECT_EQ(ours.ids, ref["exported_ids"][i].get<std::vector<int32_t>>())
          << tokenizer_file << " conversation " << i;
      Conversation before = c;
      before.messages.pop_back();
      std::string prompt;
      for (const auto& span : render_conversation(t, before)) prompt += span.text;
      prompt += chat_generation_prompt(t);
      EXPECT_EQ(tok->encode(prompt), ref["prompt_ids"][i].get<std::vector<int32_t>>())
          << tokenizer_file << " conversation " << i;
    }
  }
  static fs::path dir_;
};
fs::path ChatTemplateReference::dir_;

TEST_F(ChatTemplateReference, Llama3AsTransformersWritesIt) { check(ChatTemplate::kLlama3, "hf-llama3.json"); }
TEST_F(ChatTemplateReference, ChatMlAsTransformersWritesIt) { check(ChatTemplate::kChatMl, "hf-qwen2.json"); }
TEST_F(ChatTemplateReference, ChatMlOnAVocabularyTideTrainedAsTransformersWritesIt) {
  check(ChatTemplate::kChatMl, "tide-chatml.json");
}
TEST_F(ChatTemplateReference, GemmaAsTransformersWritesIt) { check(ChatTemplate::kGemma, "tide-gemma.json"); }

// Tool use (Qwen 2.5's and 3's format): the functions' specifications with their keys in
// the order given, calls after content or alone, arguments as an object or a string,
// consecutive results in one turn, a system message or none, text outside ASCII.
TEST_F(ChatTemplateReference, ChatMlToolUseAsTransformersWritesIt) {
  const std::string tools =
      R"("tools": [{"type": "function", "function": {"name": "add", "description": "Adds.", "parameters": )"
      R"({"type": "object", "properties": {"b": {"type": "number"}, "a": {"type": "number"}}, "required": ["b", "a"]}}},)"
      R"( {"type": "function", "function": {"name": "caf\u00e9", "parameters": {}}}])";
  const std::vector<std::string> lines = {
      "{" + tools +
          R"(, "messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "2+2?"},)"
          R"( {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function":)"
          R"( {"name": "add", "arguments": {"b": 2, "a": 2.5}}}]}, {"role": "tool", "content": "4.5"},)"
          R"( {"role": "assistant", "content": "It is 4.5."}]})",
      "{" + tools +
          R"(, "messages": [{"role": "user", "content": "Two calls"}, {"role": "assistant", "content":)"
          R"( "Calling both.", "tool_calls": [{"name": "add", "arguments": "{\"a\": 1, \"b\": 2}"},)"
          R"( {"name": "caf\u00e9", "arguments": {"x": [1, "\u00e9\n", null, true]}}]},)"
          R"( {"role": "tool", "content": "3"}, {"role": "tool", "content": [{"type": "text", "text": "ok"}]},)"
          R"( {"role": "assistant", "content": "Done"}]})",
      // Tool results and calls without tools listed.
      R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"name": "f",)"
      R"( "arguments": {}}]}, {"role": "tool", "content": "r"}, {"role": "user", "content": "and?"},)"
      R"( {"role": "assistant", "content": "a"}]})",
  };
  check(ChatTemplate::kChatMl, "hf-qwen2.json", lines);
  check(ChatTemplate::kChatMl, "tide-chatml.json", lines);
}

}  // namespace
}  // namespace tide
