#include "tide/engine/data/token_dataset.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include "tide/engine/data/chat_template.h"
#include "tide/engine/io/file_name.h"
#include "tide/engine/io/json_input.h"

namespace tide {

TokenSplit::TokenSplit(const std::string& bin_path, const std::string& idx_path, int dtype_bytes,
                       const std::string& mask_path)
    : bin_(bin_path), dtype_bytes_(dtype_bytes) {
  if (bin_.size() % static_cast<size_t>(dtype_bytes) != 0)
    throw std::runtime_error(bin_path + ": size " + std::to_string(bin_.size()) + " is not a multiple of " +
                             std::to_string(dtype_bytes) + "-byte tokens");
  n_tokens_ = static_cast<int64_t>(bin_.size() / static_cast<size_t>(dtype_bytes));
  if (!mask_path.empty()) {
    mask_ = MappedFile(mask_path);
    has_mask_ = true;
    if (mask_.size() != static_cast<size_t>(n_tokens_))
      throw std::runtime_error(mask_path + ": size " + std::to_string(mask_.size()) +
                               " is not one byte for each of the " + std::to_string(n_tokens_) + " tokens of " +
                               bin_path);
  }
  const MappedFile idx(idx_path);
  if (idx.size() < 24 || std::memcmp(idx.data(), kIndexMagic, 8) != 0)
    throw std::runtime_error(idx_path + ": not a tide index (bad magic)");
  uint64_t version = 0, n_docs = 0;
  std::memcpy(&version, idx.data() + 8, 8);
  std::memcpy(&n_docs, idx.data() + 16, 8);
  if (version != kIndexVersion)
    throw std::runtime_error(idx_path + ": index version " + std::to_string(version) + " is not supported");
  // The count is checked against the file's size by division: 24 + 8 * (n_docs + 1)
  // wraps around for a count near 2^61.
  if ((idx.size() - 24) % 8 != 0 || n_docs != (idx.size() - 24) / 8 - 1)
    throw std::runtime_error(idx_path + ": size " + std::to_string(idx.size()) + " does not match " +
                             std::to_string(n_docs) + " documents");
  doc_offsets_.resize(n_docs + 1);
  std::memcpy(doc_offsets_.data(), idx.data() + 24, 8 * (n_docs + 1));
  if (doc_offsets_.front() != 0 || doc_offsets_.back() != static_cast<uint64_t>(n_tokens_))
    throw std::runtime_error(idx_path + ": offsets run from " + std::to_string(doc_offsets_.front()) + " to " +
                             std::to_string(doc_offsets_.back()) + ", not from 0 to the token count " +
                             std::to_string(n_tokens_) + " of " + bin_path);
  for (size_t d = 1; d < doc_offsets_.size(); ++d)
    if (doc_offsets_[d] < doc_offsets_[d - 1])
      throw std::runtime_error(idx_path + ": document " + std::to_string(d - 1) + " ends at offset " +
                               std::to_string(doc_offsets_[d]) + ", before its start " +
                               std::to_string(doc_offsets_[d - 1]));
}

namespace {

template <typename Id>
Id max_id(const uint8_t* bytes, size_t n_ids) {
  Id m = 0;
  const auto* p = reinterpret_cast<const Id*>(bytes);  // mmap'd pages are aligned
  for (size_t i = 0; i < n_ids; ++i) m = std::max(m, p[i]);
  return m;
}

}  // namespace

std::string xxh3_text(uint64_t digest) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  return hex;
}

void TokenSplit::verify(int64_t vocab_size, const std::string& xxh3_hex, const std::string& mask_xxh3_hex) const {
  if (has_mask_) verify_loss_mask(mask_xxh3_hex);
  // One sequential pass: the hash and the largest id of each chunk. Only a chunk whose
  // largest id is out of range is searched again, for the offset of its first bad id.
  constexpr size_t kChunk = size_t{64} << 20;
  if (bin_.size() > (size_t{1} << 30))
    spdlog::info("verifying {} ({:.1f} GiB): token ids and hash", bin_.path(), static_cast<double>(bin_.size()) / (1 << 30));
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t start = 0; start < bin_.size(); start += kChunk) {
    const size_t n = std::min(kChunk, bin_.size() - start);
    XXH3_64bits_update(&state, bin_.data() + start, n);
    const size_t n_ids = n / static_cast<size_t>(dtype_bytes_);
    const int64_t m = dtype_bytes_ == 2 ? max_id<uint16_t>(bin_.data() + start, n_ids) : max_id<uint32_t>(bin_.data() + start, n_ids);
    if (m < vocab_size) continue;
    const int64_t first = static_cast<int64_t>(start) / dtype_bytes_;
    for (int64_t i = first;; ++i)
      if (static_cast<int64_t>(at(i)) >= vocab_size)
        throw std::runtime_error(fmt::format("{}: token id {} at token offset {} (byte {}) is not below the dataset's "
                                             "vocabulary size {}",
                                             bin_.path(), at(i), i, i * dtype_bytes_, vocab_size));
  }
  if (xxh3_hex.empty()) return;
  const std::string hex = xxh3_text(XXH3_64bits_digest(&state));
  if (xxh3_hex != hex)
    throw std::runtime_error(fmt::format("{}: contents hash to xxh3 {}, dataset.json records {}: the file changed "
                                         "after `tide data prepare` (prepare the dataset again)",
                                         bin_.path(), hex, xxh3_hex));
}

void TokenSplit::verify_loss_mask(const std::string& xxh3_hex) const {
  const uint8_t* p = mask_.data();
  for (size_t i = 0; i < mask_.size(); ++i)
    if (p[i] > 1)
      throw std::runtime_error(fmt::format("{}: byte {} at token offset {} is neither 0 (not counted) nor 1 (counted)",
                                           mask_.path(), p[i], i));
  if (xxh3_hex.empty()) return;
  const std::string hex = xxh3_text(XXH3_64bits(p, mask_.size()));
  if (xxh3_hex != hex)
    throw std::runtime_error(
        fmt::format("{}: contents hash to xxh3 {}, dataset.json records {}: the file changed "
                    "after `tide data prepare` (prepare the dataset again)",
                    mask_.path(), hex, xxh3_hex));
}

void TokenSplit::copy_loss_mask(int64_t start, int64_t n, uint8_t* out) const {
  if (!has_mask_) throw std::logic_error("a split without a loss mask asked for one");
  if (start < 0 || n < 0 || start + n > n_tokens_) throw std::out_of_range("token window outside the split");
  std::memcpy(out, mask_.data() + start, static_cast<size_t>(n));
}

int64_t TokenSplit::documents_starting_by(int64_t position) const {
  // The last offset is the token count, not a document's start.
  const auto last = doc_offsets_.end() - 1;
  return std::upper_bound(doc_offsets_.begin(), last, static_cast<uint64_t>(std::max<int64_t>(position, 0))) -
         doc_offsets_.begin();
}

uint32_t TokenSplit::at(int64_t i) const {
  if (dtype_bytes_ == 2) {
    uint16_t v;
    std::memcpy(&v, bin_.data() + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, bin_.data() + 4 * i, 4);
  return v;
}

void TokenSplit::copy(int64_t start, int64_t n, int64_t* out) const {
  if (start < 0 || start + n > n_tokens_) throw std::out_of_range("token window outside the split");
  if (dtype_bytes_ == 2) {
    const auto* p = reinterpret_cast<const uint16_t*>(bin_.data()) + start;
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  } else {
    const auto* p = reinterpret_cast<const uint32_t*>(bin_.data()) + start;
    for (int64_t i = 0; i < n; ++i) out[i] = p[i];
  }
}

void TokenSplit::copy_documents(int64_t start, int64_t n, int32_t* out) const {
  if (start < 0 || n < 0 || start + n > n_tokens_) throw std::out_of_range("token window outside the split");
  // `end`: the offset where the current token's document ends, the first one past the
  // token (the last offset is the token count, so the walk stays inside the index).
  // Empty documents (equal offsets) are stepped over without a number of their own.
  auto end = std::upper_bound(doc_offsets_.begin(), doc_offsets_.end(), static_cast<uint64_t>(start));
  int32_t document = 0;
  for (int64_t i = 0; i < n; ++i) {
    const auto token = static_cast<uint64_t>(start + i);
    if (*end <= token) {
      while (*end <= token) ++end;
      ++document;
    }
    out[i] = document;
  }
}

namespace {
// dataset.json's fields that say how to read the token files, checked; the recorded
// splits are checked against the files by the caller.
struct MetaFields {
  int dtype_bytes = 2;
  int64_t vocab_size = 0;
  const nlohmann::json* splits = nullptr;  // into the metadata; null when not recorded
  bool loss_mask = false;                  // each split has its <split>.mask
};

MetaFields check_meta(const nlohmann::json& meta, const std::string& meta_path) {
  if (!meta.is_object()) throw std::runtime_error(meta_path + ": not a JSON object");
  const auto tokenizer = meta.value("tokenizer", std::string("tokenizer.json"));
  if (!is_plain_file_name(tokenizer))
    throw std::runtime_error(meta_path + ": tokenizer " + nlohmann::json(tokenizer).dump() +
                             " is not a file name inside the dataset directory");
  if (meta.value("format", "") != "tide-tokens") throw std::runtime_error(meta_path + ": format is not 'tide-tokens'");
  if (meta.value("version", 0) != kDatasetFormatVersion)
    throw std::runtime_error(meta_path + ": version " + meta.value("version", nlohmann::json(0)).dump() +
                             " is not supported");
  const std::string dtype = meta.value("dtype", "");
  if (dtype != "uint16" && dtype != "uint32")
    throw std::runtime_error(meta_path + ": dtype '" + dtype + "' is unknown");
  MetaFields f;
  f.dtype_bytes = dtype == "uint16" ? 2 : 4;
  const auto& vocab = meta.contains("vocab_size") ? meta["vocab_size"] : nlohmann::json();
  if (!vocab.is_number_integer() || vocab.get<int64_t>() < 1 || vocab.get<int64_t>() > (int64_t{1} << 32))
    throw std::runtime_error(meta_path + ": vocab_size " + vocab.dump() + " is not an integer in [1, 2^32]");
  f.vocab_size = vocab.get<int64_t>();
  if (meta.contains("splits")) {
    const auto& recorded = meta["splits"];
    if (!recorded.is_null() && !recorded.is_object()) throw std::runtime_error(meta_path + ": splits is not an object");
    if (recorded.is_object()) f.splits = &recorded;
  }
  if (f.splits)
    for (const char* name : {"train", "val"}) {
      if (!f.splits->contains(name)) continue;
      const auto& r = (*f.splits)[name];
      const std::string field = meta_path + ": splits." + name;
      if (!r.is_object()) throw std::runtime_error(field + " is not an object");
      if (r.contains("xxh3") && (!r["xxh3"].is_string() || r["xxh3"].get<std::string>().size() != 16))
        throw std::runtime_error(field + ".xxh3 " + r["xxh3"].dump() + " is not 16 hex digits");
      if (r.contains("tokens") && !r["tokens"].is_number_unsigned())
        throw std::runtime_error(field + ".tokens " + r["tokens"].dump() + " is not a count");
      if (r.contains("mask_xxh3") && (!r["mask_xxh3"].is_string() || r["mask_xxh3"].get<std::string>().size() != 16))
        throw std::runtime_error(field + ".mask_xxh3 " + r["mask_xxh3"].dump() + " is not 16 hex digits");
    }
  if (meta.contains("chat_template")) {
    const auto& t = meta["chat_template"];
    if (!t.is_string()) throw std::runtime_error(meta_path + ": chat_template " + t.dump() + " is not a name");
    try {
      chat_template_named(t.get<std::string>());
    } catch (const std::invalid_argument& e) {
      throw std::runtime_error(meta_path + ": " + e.what());
    }
  }
  if (meta.contains("loss_mask")) {
    if (!meta["loss_mask"].is_boolean())
      throw std::runtime_error(meta_path + ": loss_mask " + meta["loss_mask"].dump() + " is not true or false");
    f.loss_mask = meta["loss_mask"].get<bool>();
  }
  return f;
}

nlohmann::json read_meta(const std::string& dir) {
  const std::string meta_path = dir + "/dataset.json";
  if (!std::ifstream(meta_path))
    throw std::runtime_error("'" + dir + "' is not a prepared dataset (no dataset.json); run `tide data prepare`");
  return read_json_file(meta_path);
}

// Runs `check` with a field of the wrong type reported as the library words it, after the
// file's name.
template <class F>
auto naming_the_file(const std::string& meta_path, F check) {
  try {
    return check();
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(meta_path + ": " + json_error_text(e));
  }
}
}  // namespace

nlohmann::json TokenDataset::read_checked_meta(const std::string& dir) {
  nlohmann::json meta = read_meta(dir);
  const std::string meta_path = dir + "/dataset.json";
  naming_the_file(meta_path, [&] { return check_meta(meta, meta_path); });
  return meta;
}

TokenDataset::TokenDataset(const std::string& dir) : dir_(dir) {
  meta_ = read_meta(dir);
  const std::string meta_path = dir + "/dataset.json";
  naming_the_file(meta_path, [&] {
    check(meta_path);
    return 0;
  });
}

void TokenDataset::check(const std::string& meta_path) {
  const MetaFields f = check_meta(meta_, meta_path);
  vocab_size_ = f.vocab_size;
  loss_mask_ = f.loss_mask;
  for (const char* name : {"train", "val"}) {
    TokenSplit split(dir_ + "/" + name + ".bin", dir_ + "/" + name + ".idx", f.dtype_bytes,
                     f.loss_mask ? dir_ + "/" + name + ".mask" : "");
    std::string xxh3, mask_xxh3;
    if (f.splits && f.splits->contains(name)) {
      const auto& r = (*f.splits)[name];
      if (r.contains("xxh3")) xxh3 = r["xxh3"].get<std::string>();
      if (r.contains("mask_xxh3")) mask_xxh3 = r["mask_xxh3"].get<std::string>();
      if (r.contains("tokens") && r["tokens"] != split.size())
        throw std::runtime_error(meta_path + ": splits." + name + ".tokens " + r["tokens"].dump() +
                                 " differs from the " + std::to_string(split.size()) + " tokens in " + name + ".bin");
    }
    split.verify(vocab_size_, xxh3, mask_xxh3);
    splits_.emplace_back(name, std::move(split));
  }
}

std::string TokenDataset::tokenizer_path_of(const std::string& dir, const nlohmann::json& meta) {
  return dir + "/" + meta.value("tokenizer", "tokenizer.json");
}

std::string TokenDataset::tokenizer_path() const { return tokenizer_path_of(dir_, meta_); }

const TokenSplit& TokenDataset::split(const std::string& name) const {
  for (const auto& [n, s] : splits_)
    if (n == name) return s;
  throw std::invalid_argument("dataset '" + dir_ + "' has no split '" + name + "'");
}

}  // namespace tide
