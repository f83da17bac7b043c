// A tokenizer file a user hands tide (tokenizer.json or a SentencePiece tokenizer.model):
// it is refused naming the file, or it encodes text to ids inside its vocabulary and
// decodes any id without a fault.
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "fuzz_input.h"
#include "tide/engine/data/tokenizer.h"

namespace {

// ASCII, spaces and their runs, digits, punctuation, several scripts, an emoji, a byte
// that is not UTF-8, and the special tokens of the supported families.
const char* const kTexts[] = {
    "Hello, world! It's 2026: 42 tokens.",
    "  leading   and trailing   spaces  \n\ttabs\r\n",
    "Grüße, こんにちは, Привет, مرحبا, 你好 🙂",
    "<|endoftext|>text<s>more</s><|begin_of_text|><unk>",
    "\xff\xfe invalid \xc3 utf-8",
    "",
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tide;
  const auto path = fuzz::write_file("tokenizer", {reinterpret_cast<const char*>(data), size});
  std::unique_ptr<Tokenizer> t;
  try {
    t = load_tokenizer(path);
  } catch (const std::exception& e) {
    fuzz::expect_names(e.what(), path);
    return 0;
  }
  const int64_t vocab = t->vocab_size();
  if (vocab < 1) fuzz::fault("a tokenizer was loaded with " + std::to_string(vocab) + " ids");
  for (const char* text : kTexts) {
    const std::vector<int32_t> ids = t->encode(text);
    for (const int32_t id : ids)
      if (id < 0 || id >= vocab)
        fuzz::fault("\"" + std::string(text) + "\" encodes to id " + std::to_string(id) +
                    ", outside the vocabulary of " + std::to_string(vocab));
    t->decode(ids);
  }
  for (const int32_t id : {int32_t{-1}, int32_t{0}, static_cast<int32_t>(vocab - 1), static_cast<int32_t>(vocab)})
    t->decode_one(id);
  // What tide saves into a dataset or a run directory must load again as the same tokenizer.
  const auto saved = fuzz::work_dir() + "/saved." + t->file_name();
  t->save(saved);
  const auto again = load_tokenizer(saved);
  if (again->vocab_size() != vocab) fuzz::fault("the saved tokenizer has another vocabulary size");
  for (const char* text : kTexts)
    if (again->encode(text) != t->encode(text))
      fuzz::fault("the saved tokenizer encodes \"" + std::string(text) + "\" otherwise");
  for (const int32_t id : {t->eos_id(), t->bos_id()}) {
    if (id >= vocab || id < -1) fuzz::fault("a special id " + std::to_string(id) + " is outside the vocabulary");
    if (id >= 0) t->token_text(id);
  }
  return 0;
}
