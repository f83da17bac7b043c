// Hugging Face normalisation for byte-level BPE tokenizer.json files: the Unicode
// normal forms (NFC, NFD, NFKC, NFKD) and a Sequence of them, as Qwen2's and
// GPT-NeoX's files ask for. The text is normalised before it is pre-tokenised; ids
// then match the tokenizers library's on any text, composed or not.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tide {

class Normalizer {
 public:
  enum class Form { Nfc, Nfd, Nfkc, Nfkd };

  // None: the text as it is.
  Normalizer() = default;
  // From tokenizer.json's "normalizer" (null is none). Any other kind (Lowercase,
  // Replace, Prepend, ...) is refused with a message naming it and the file.
  static Normalizer from_json(const nlohmann::json& spec, const std::string& file);
  nlohmann::json to_json() const;  // null when none

  bool empty() const { return forms_.empty(); }
  // Bytes that are not well-formed UTF-8 pass through unchanged.
  std::string apply(std::string_view text) const;

 private:
  std::vector<Form> forms_;  // applied in order
};

}  // namespace tide
