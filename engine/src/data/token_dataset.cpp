#include "tide/engine/data/token_dataset.h"

#include <cstring>
#include <fstream>
#include <stdexcept>

#include "tide/engine/io/json_input.h"

namespace tide {

TokenSplit::TokenSplit(const std::string& bin_path, const std::string& idx_path, int dtype_bytes)
    : bin_(bin_path), dtype_bytes_(dtype_bytes) {
  if (bin_.size() % static_cast<size_t>(dtype_bytes) != 0)
    throw std::runtime_error(bin_path + ": size " + std::to_string(bin_.size()) + " is not a multiple of " +
                             std::to_string(dtype_bytes) + "-byte tokens");
  n_tokens_ = static_cast<int64_t>(bin_.size() / static_cast<size_t>(dtype_bytes));
  const MappedFile idx(idx_path);
  if (idx.size() < 24 || std::memcmp(idx.data(), kIndexMagic, 8) != 0)
    throw std::runtime_error(idx_path + ": not a tide index (bad magic)");
  uint64_t version = 0, n_docs = 0;
  std::memcpy(&version, idx.data() + 8, 8);
  std::memcpy(&n_docs, idx.data() + 16, 8);
  if (version != kIndexVersion)
    throw std::runtime_error(idx_path + ": index version " + std::to_string(version) + " is not supported");
  if (idx.size() != 24 + 8 * (n_docs + 1))
    throw std::runtime_error(idx_path + ": size " + std::to_string(idx.size()) + " does not match " +
                             std::to_string(n_docs) + " documents");
  doc_offsets_.resize(n_docs + 1);
  std::memcpy(doc_offsets_.data(), idx.data() + 24, 8 * (n_docs + 1));
  if (doc_offsets_.back() != static_cast<uint64_t>(n_tokens_))
    throw std::runtime_error(idx_path + ": last offset " + std::to_string(doc_offsets_.back()) +
                             " differs from the token count " + std::to_string(n_tokens_) + " of " + bin_path);
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

TokenDataset::TokenDataset(const std::string& dir) : dir_(dir) {
  const std::string meta_path = dir + "/dataset.json";
  if (!std::ifstream(meta_path))
    throw std::runtime_error("'" + dir + "' is not a prepared dataset (no dataset.json); run `tide data prepare`");
  meta_ = read_json_file(meta_path);
  if (!meta_.is_object()) throw std::runtime_error(meta_path + ": not a JSON object");
  if (meta_.value("format", "") != "tide-tokens")
    throw std::runtime_error(meta_path + ": format is not 'tide-tokens'");
  if (meta_.value("version", 0) != kDatasetFormatVersion)
    throw std::runtime_error(meta_path + ": version " + meta_.value("version", nlohmann::json(0)).dump() +
                             " is not supported");
  const std::string dtype = meta_.value("dtype", "");
  if (dtype != "uint16" && dtype != "uint32") throw std::runtime_error(meta_path + ": dtype '" + dtype + "' is unknown");
  const int bytes = dtype == "uint16" ? 2 : 4;
  for (const char* name : {"train", "val"})
    splits_.emplace_back(name, TokenSplit(dir + "/" + name + ".bin", dir + "/" + name + ".idx", bytes));
}

std::string TokenDataset::tokenizer_path() const { return dir_ + "/" + meta_.value("tokenizer", "tokenizer.json"); }

const TokenSplit& TokenDataset::split(const std::string& name) const {
  for (const auto& [n, s] : splits_)
    if (n == name) return s;
  throw std::invalid_argument("dataset '" + dir_ + "' has no split '" + name + "'");
}

}  // namespace tide
