// Byte-level BPE tokenizer, stored in the Hugging Face `tokenizer.json` format
// (GPT-2 byte-to-unicode alphabet, GPT-2 pre-tokenisation). A byte tokenizer is the
// same thing with no merges: 256 byte ids plus the end-of-text id.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tide {

class Tokenizer {
 public:
  // 256 byte ids, then "<|endoftext|>".
  static Tokenizer bytes();
  // Loads a Hugging Face tokenizer.json with a byte-level BPE model. Throws naming the
  // file and what it does not support.
  static Tokenizer load(const std::string& path);
  // tokens: byte strings, index = id; merges: pairs of ids in rank order.
  Tokenizer(std::vector<std::string> tokens, std::vector<std::pair<int32_t, int32_t>> merges,
            std::vector<std::string> special);

  void save(const std::string& path) const;

  // Not thread-safe: encode memoises pre-tokenised chunks.
  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string decode_one(int32_t id) const;

  int64_t vocab_size() const { return static_cast<int64_t>(tokens_.size()); }
  int32_t eos_id() const { return eos_id_; }
  size_t merge_count() const { return merges_.size(); }

 private:
  void index();
  void encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;  // id → bytes
  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::vector<bool> special_;
  std::map<std::pair<int32_t, int32_t>, std::pair<int32_t, int32_t>> merge_rank_;  // pair → (rank, result id)
  int32_t eos_id_ = -1;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// Trains a byte-level BPE vocabulary of `vocab_size` ids (256 bytes + merges + the
// end-of-text id) on the given texts. Deterministic: ties go to the smaller pair.
Tokenizer train_bpe(const std::vector<std::string_view>& texts, int64_t vocab_size,
                    const std::function<void(int64_t done, int64_t total)>& progress = {});

// GPT-2 pre-tokenisation: contractions, optional-space + letters / digits / other,
// whitespace runs. Letters are ASCII letters and every non-ASCII code point (exact
// for ASCII text; an approximation of \p{L} otherwise).
std::vector<std::string_view> pretokenize(std::string_view text);

// GPT-2's reversible byte ↔ printable-unicode mapping used in tokenizer.json.
const std::vector<std::string>& byte_to_unicode();

}  // namespace tide
