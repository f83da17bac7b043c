// Hugging Face pre-tokenisation for byte-level BPE: the text is split into pieces by
// regular expressions (ICU's engine, so \p{L}, \p{N}, look-ahead and nested classes
// behave as in the tokenizers library) before BPE runs inside each piece.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tide {

// GPT-2's pattern, used by ByteLevel(use_regex = true).
extern const char* const kGpt2SplitPattern;

class PreTokenizer {
 public:
  // ByteLevel with GPT-2's regex: what tide writes for the tokenizers it trains.
  static PreTokenizer gpt2();
  // From tokenizer.json's "pre_tokenizer": ByteLevel, Split (Regex or String, behaviour
  // Isolated / Removed / MergedWithPrevious / MergedWithNext) and Sequence of those,
  // with a ByteLevel step somewhere (byte-level BPE). Anything else is refused with a
  // message naming it and the file.
  static PreTokenizer from_json(const nlohmann::json& spec, const std::string& file);
  nlohmann::json to_json() const;

  // Pieces in order; their concatenation is the text minus removed delimiters (and
  // plus the prefix space when add_prefix_space is set: see prefix()).
  std::vector<std::string> split(std::string_view text) const;

  struct Step;

 private:
  std::vector<std::shared_ptr<const Step>> steps_;
  std::string spec_;  // the JSON it was built from, dumped
};

}  // namespace tide
