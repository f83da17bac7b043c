// A prepared dataset directory (format in docs/data.md):
//   dataset.json            metadata: dtype, vocabulary, splits, checksums
//   tokenizer.json          the tokenizer that produced the ids
//   {train,val}.bin         raw little-endian token ids (uint16 or uint32)
//   {train,val}.idx         document offsets into the .bin
//   {train,val}.mask        with "loss_mask": one byte a token, 1 where it counts as a target
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tide/engine/io/mapped_file.h"

namespace tide {

inline constexpr char kIndexMagic[8] = {'T', 'I', 'D', 'E', 'I', 'D', 'X', '\0'};
inline constexpr uint64_t kIndexVersion = 1;
inline constexpr int64_t kDatasetFormatVersion = 1;

// A split's XXH3-64 as dataset.json records it: 16 lowercase hex digits.
std::string xxh3_text(uint64_t digest);

// One split, memory-mapped.
class TokenSplit {
 public:
  // `mask_path`: the split's loss mask, or "" for none.
  TokenSplit(const std::string& bin_path, const std::string& idx_path, int dtype_bytes,
             const std::string& mask_path = "");
  // Reads the whole .bin once: every id must be below `vocab_size` (the error names the
  // file, the id and its token offset) and, when `xxh3_hex` is not empty, the bytes must
  // hash to it (the value `tide data prepare` recorded in dataset.json). The loss mask
  // likewise: every byte 0 or 1, hashing to `mask_xxh3_hex` when that is not empty.
  void verify(int64_t vocab_size, const std::string& xxh3_hex, const std::string& mask_xxh3_hex = "") const;
  int64_t size() const { return n_tokens_; }
  int64_t documents() const { return static_cast<int64_t>(doc_offsets_.size()) - 1; }
  uint32_t at(int64_t i) const;
  // Copies n tokens starting at `start` as int64 (the dtype LibTorch wants for ids).
  void copy(int64_t start, int64_t n, int64_t* out) const;
  // For each of the n tokens from `start`, its document counted from the one that holds
  // `start`: 0 0 0 1 1 2 ... (a document ends with its end-of-text token).
  void copy_documents(int64_t start, int64_t n, int32_t* out) const;
  // The loss mask (<split>.mask): whether token i counts as a target, that is whether the
  // prediction of it from the tokens before it is in the loss.
  bool has_loss_mask() const { return has_mask_; }
  // The mask's bytes of the n tokens from `start` (1: counts, 0: does not).
  void copy_loss_mask(int64_t start, int64_t n, uint8_t* out) const;
  // The first token of document d, and how many documents start at or before `position`.
  int64_t document_start(int64_t d) const { return static_cast<int64_t>(doc_offsets_.at(static_cast<size_t>(d))); }
  int64_t documents_starting_by(int64_t position) const;

 private:
  void verify_loss_mask(const std::string& xxh3_hex) const;

  MappedFile bin_, mask_;
  bool has_mask_ = false;
  int dtype_bytes_;
  int64_t n_tokens_;
  std::vector<uint64_t> doc_offsets_;
};

class TokenDataset {
 public:
  // Opens and checks a dataset directory, reading every split once (TokenSplit::verify):
  // a bad id or a changed file fails here, not at the batch that holds it. Errors name the
  // file and the problem.
  explicit TokenDataset(const std::string& dir);
  // dataset.json of `dir` with the constructor's checks of it, without reading the token
  // files (a daemon checks a recipe's data this way at submit).
  static nlohmann::json read_checked_meta(const std::string& dir);
  // The tokenizer file a dataset's metadata names, in `dir`.
  static std::string tokenizer_path_of(const std::string& dir, const nlohmann::json& meta);

  const std::string& dir() const { return dir_; }
  const nlohmann::json& meta() const { return meta_; }
  int64_t vocab_size() const { return vocab_size_; }
  bool has_loss_mask() const { return loss_mask_; }  // every split has its <split>.mask
  std::string tokenizer_path() const;
  const TokenSplit& split(const std::string& name) const;  // "train" or "val"

 private:
  void check(const std::string& meta_path);  // the constructor's checks of dataset.json and the splits

  std::string dir_;
  nlohmann::json meta_;
  int64_t vocab_size_ = 0;
  bool loss_mask_ = false;
  std::vector<std::pair<std::string, TokenSplit>> splits_;
};

}  // namespace tide
