// Fine-tuning examples a user hands `tide data prepare` (JSON lines of prompt-completion
// pairs or conversations): refused naming the file, or read into examples that every chat
// template writes (or refuses, naming the line) and that encode to ids inside the
// vocabulary with one mask byte each.
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "tide/engine/data/chat_template.h"
#include "tide/engine/data/fine_tuning_examples.h"
#include "tide/engine/data/text_spans.h"
#include "tide/engine/data/tokenizer.h"

namespace {

const tide::ByteLevelBpe& tokenizer() {
  static const tide::ByteLevelBpe t = [] {
    tide::ByteLevelBpe b = tide::ByteLevelBpe::bytes();
    for (const auto& name : tide::chat_template_names())
      b.add_special_tokens(tide::chat_special_tokens(tide::chat_template_named(name)));
    return b;
  }();
  return t;
}

void check_encoding(const std::vector<tide::TextSpan>& spans) {
  const tide::CountedIds r = tide::encode_spans(tokenizer(), spans);
  if (r.counted.size() != r.ids.size())
    tide::fuzz::fault(std::to_string(r.ids.size()) + " ids with " + std::to_string(r.counted.size()) + " mask bytes");
  for (const int32_t id : r.ids)
    if (id < 0 || id >= tokenizer().vocab_size())
      tide::fuzz::fault("id " + std::to_string(id) + " outside the vocabulary");
  for (const uint8_t c : r.counted)
    if (c > 1) tide::fuzz::fault("a mask byte " + std::to_string(c));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tide;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string path = "examples.jsonl";
  try {
    for (const auto& e : read_prompt_completions(text, path)) check_encoding({{e.prompt, false}, {e.completion, true}});
  } catch (const std::exception& e) {
    fuzz::expect_names(e.what(), path);
  }
  std::vector<Conversation> conversations;
  try {
    conversations = read_conversations(text, path);
  } catch (const std::exception& e) {
    fuzz::expect_names(e.what(), path);
    return 0;
  }
  for (const auto& c : conversations)
    for (const auto& name : chat_template_names()) {
      try {
        check_encoding(render_conversation(chat_template_named(name), c));
      } catch (const std::runtime_error& e) {
        fuzz::expect_names(e.what(), c.where);
      }
    }
  return 0;
}
