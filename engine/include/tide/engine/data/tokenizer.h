// Tokenizers: text ↔ ids. Two kinds, one interface:
//  - ByteLevelBpe: byte-level BPE stored as a Hugging Face `tokenizer.json` (GPT-2 byte
//    alphabet; the file's normalizer and pre-tokenizer, GPT-2's for those tide trains);
//    a byte tokenizer is one with no merges.
//  - SentencePieceBpe: a SentencePiece BPE `tokenizer.model` (LLaMA-1/2), read from its
//    protobuf bytes directly: Debian's libsentencepiece cannot share a process with
//    LibTorch (protobuf 3.14 vs 3.21).
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

#include "tide/engine/data/normalizer.h"
#include "tide/engine/data/pretokenizer.h"

namespace tide {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const;
  // The bytes of one id, for streaming output.
  virtual std::string decode_one(int32_t id) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eos_id() const = 0;
  // The id a sequence starts with, -1 when the tokenizer has none (tide's own data never
  // inserts one; exports then name the end-of-text id, GPT-2's convention).
  virtual int32_t bos_id() const = 0;
  // The stored form of a vocabulary entry ("<|endoftext|>", "<s>", "▁the"), for files
  // such as tokenizer_config.json that name special tokens by text.
  virtual std::string token_text(int32_t id) const = 0;
  // The file name this kind is stored under in dataset and run directories.
  virtual std::string file_name() const = 0;
  virtual void save(const std::string& path) const = 0;
};

// Chooses the kind by content: a JSON object is a tokenizer.json, anything else is
// parsed as a SentencePiece model. Errors name the file and what is unsupported.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

class ByteLevelBpe : public Tokenizer {
 public:
  // 256 byte ids, then "<|endoftext|>".
  static ByteLevelBpe bytes();
  // Byte-level BPE tokenizer.json files (GPT-2, BLOOM, LLaMA-3 and the like). Special
  // tokens found in the text encode to their ids, as the tokenizers library does.
  static ByteLevelBpe load(const std::string& path);
  // tokens: byte strings, index = id; merges: pairs of ids in rank order; special
  // tokens are appended after them. Pre-tokenisation is GPT-2's.
  ByteLevelBpe(std::vector<std::string> tokens, std::vector<std::pair<int32_t, int32_t>> merges,
               std::vector<std::string> special);

  // Not thread-safe: encode memoises pre-tokenised chunks.
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode_one(int32_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  int32_t eos_id() const override { return eos_id_; }
  int32_t bos_id() const override { return bos_id_; }
  std::string token_text(int32_t id) const override;
  std::string file_name() const override { return "tokenizer.json"; }
  void save(const std::string& path) const override;
  size_t merge_count() const { return merges_.size(); }
  // Appends each of `texts` that is not yet a special token as one, after every id (as
  // the tokenizers library's add_special_tokens does).
  void add_special_tokens(const std::vector<std::string>& texts);

 private:
  ByteLevelBpe() = default;
  static ByteLevelBpe from_json(const nlohmann::json& doc, const std::string& path);
  void index();
  void bytes_to_ids(std::string_view bytes, std::vector<int32_t>& out) const;
  void encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const;

  std::vector<std::string> tokens_;  // id → bytes
  std::vector<std::pair<int32_t, int32_t>> merges_;
  std::vector<bool> special_;
  std::map<std::pair<int32_t, int32_t>, std::pair<int32_t, int32_t>> merge_rank_;  // pair → (rank, result id)
  std::unordered_map<std::string, int32_t> by_bytes_;  // non-special tokens
  // The id of each single byte's token, -1 where the vocabulary has none. Real files put
  // the byte tokens anywhere (GPT-2's "!" is id 0); only tide's own start at 0.
  int32_t byte_ids_[256] = {};
  std::vector<std::pair<std::string, int32_t>> specials_;  // matched in text, longest first
  Normalizer normalizer_;                                  // before pre-tokenisation; special tokens match the raw text
  PreTokenizer pre_ = PreTokenizer::gpt2();
  bool ignore_merges_ = false;  // a piece that is itself in the vocabulary is one id
  int32_t eos_id_ = -1, bos_id_ = -1;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

class SentencePieceBpe : public Tokenizer {
 public:
  // Supports model_type BPE with the "identity" normaliser (as LLaMA-1/2 and Gemma ship),
  // with or without byte fallback, dummy prefix and whitespace collapsing. User-defined
  // pieces (Gemma's <start_of_turn>) are matched whole and never merged, as sentencepiece
  // does; control pieces written in the text (<s>, </s>, Gemma's <bos>) encode to their ids,
  // as the transformers tokenizers take special tokens out first (spm_encode spells them
  // out instead), and only the text before the first of them gets the dummy prefix.
  static SentencePieceBpe load(const std::string& path);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  std::string decode_one(int32_t id) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(pieces_.size()); }
  int32_t eos_id() const override { return eos_id_; }
  int32_t bos_id() const override { return bos_id_; }
  std::string token_text(int32_t id) const override;
  std::string file_name() const override { return "tokenizer.model"; }
  void save(const std::string& path) const override;

  struct Piece {
    std::string text;
    float score = 0;
    int type = 1;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  };

 private:
  SentencePieceBpe() = default;
  std::string normalize(std::string_view text, bool dummy_prefix) const;
  void encode_stretch(std::string_view text, bool dummy_prefix, std::vector<int32_t>& ids) const;

  std::string raw_;  // the .model bytes, saved unchanged
  std::vector<Piece> pieces_;
  std::unordered_map<std::string, int32_t> by_text_;
  std::vector<size_t> user_defined_lengths_;               // distinct, longest first
  std::vector<std::pair<std::string, int32_t>> controls_;  // matched in text, longest first
  int32_t byte_ids_[256] = {};
  bool byte_fallback_ = false, add_dummy_prefix_ = true, remove_extra_whitespaces_ = true;
  int32_t unk_id_ = 0, eos_id_ = -1, bos_id_ = -1;
};

// Trains a byte-level BPE vocabulary of `vocab_size` ids (256 bytes + merges + the
// end-of-text id) on the given texts. Deterministic: ties go to the smaller pair.
// A corpus too small for the vocabulary stops early with fewer ids.
ByteLevelBpe train_bpe(const std::vector<std::string_view>& texts, int64_t vocab_size,
                       const std::function<void(int64_t done, int64_t total)>& progress = {});

// GPT-2's reversible byte ↔ printable-unicode mapping used in tokenizer.json.
const std::vector<std::string>& byte_to_unicode();

}  // namespace tide
