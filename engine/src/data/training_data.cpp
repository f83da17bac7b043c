#include "tide/engine/data/training_data.h"

#include <cstdint>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tide/engine/config_schema.h"
#include "tide/engine/io/safetensors.h"

namespace tide {
namespace {
// The tokenizer a dataset was written with: its file, known by size and XXH3 (a file
// handed to a daemon is hashed a chunk at a time, never held; -1: no file), and its
// vocabulary.
struct DatasetTokenizer {
  std::string path;
  int64_t bytes = -1;
  uint64_t hash = 0;
  int64_t vocab_size = 0;

  DatasetTokenizer(std::string file, int64_t vocab) : path(std::move(file)), vocab_size(vocab) {
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec) return;
    bytes = static_cast<int64_t>(size);
    hash = xxh3_of_file(path);
  }
  bool same_as(const DatasetTokenizer& o) const {
    return bytes == o.bytes && hash == o.hash && vocab_size == o.vocab_size;
  }
};

std::string field_of(const DataConfig& cfg, size_t i) {
  return cfg.blend.empty() ? "data.path" : fmt::format("data.blend[{}]", i + 1);
}

// What both the full open and the metadata check refuse of source `field` (directory
// `dir`): a train split (as counted, or as recorded) that holds no window, a tokenizer
// other than the first source's, no loss mask where data.loss_mask asks for one. `first`
// is set by the first source.
void check_source(const std::string& field, const std::string& dir, std::optional<uint64_t> train_tokens,
                  const DataConfig& cfg, bool has_loss_mask, const DatasetTokenizer& tokenizer,
                  std::optional<DatasetTokenizer>& first) {
  const int64_t seq_len = cfg.seq_len;
  if (cfg.loss_mask && !has_loss_mask)
    throw ConfigError(field, fmt::format("{}: data.loss_mask is set but the dataset has no loss mask (dataset.json "
                                         "\"loss_mask\"); prepare it with `tide data prepare --format "
                                         "prompt-completion` or `--format messages`, or leave data.loss_mask false",
                                         dir));
  if (train_tokens && *train_tokens < static_cast<uint64_t>(seq_len) + 1)
    throw ConfigError(field, fmt::format("{}: its train split of {} tokens is shorter than one window of {} tokens "
                                         "(data.seq_len + 1)",
                                         dir, *train_tokens, seq_len + 1));
  if (!first) {
    first = tokenizer;
    return;
  }
  if (tokenizer.same_as(*first)) return;
  throw ConfigError(field, fmt::format("{}: its tokenizer ({}, {} ids) is not data.blend[1]'s ({}, {} ids): the same "
                                       "id would be another token; prepare every dataset of a blend with one "
                                       "tokenizer (tide data prepare --tokenizer FILE)",
                                       dir, tokenizer.path, tokenizer.vocab_size, first->path, first->vocab_size));
}
}  // namespace

TrainingData::TrainingData(const DataConfig& cfg) {
  const auto sources = data_sources(cfg);
  double total = 0;
  for (const auto& s : sources) total += s.weight;
  std::optional<DatasetTokenizer> first;
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string field = field_of(cfg, i);
    const DataSource& s = sources[i];
    if (s.path.empty()) throw ConfigError(field, "no dataset: name the directory `tide data prepare` wrote");
    Source source{s.name, s.weight / total, nullptr};
    try {
      source.data = std::make_unique<TokenDataset>(s.path);  // its errors name the file
    } catch (const std::exception& e) {
      throw ConfigError(field, e.what());
    }
    check_source(field, s.path, static_cast<uint64_t>(source.data->split("train").size()), cfg,
                 source.data->has_loss_mask(),
                 DatasetTokenizer(source.data->tokenizer_path(), source.data->vocab_size()), first);
    sources_.push_back(std::move(source));
  }
}

void check_training_data(const DataConfig& cfg, const std::string& workdir, bool leave_unseen) {
  const auto sources = data_sources(cfg);
  std::optional<DatasetTokenizer> first;
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string field = field_of(cfg, i);
    if (sources[i].path.empty()) throw ConfigError(field, "no dataset: name the directory `tide data prepare` wrote");
    std::filesystem::path dir(sources[i].path);
    if (dir.is_relative()) dir = std::filesystem::path(workdir) / dir;
    std::error_code ec;
    if (leave_unseen && !std::filesystem::exists(dir, ec)) continue;
    nlohmann::json meta;
    try {
      meta = TokenDataset::read_checked_meta(dir.string());
    } catch (const std::exception& e) {
      throw ConfigError(field, e.what());
    }
    // Recorded counts were checked to be unsigned; a split's file is read by the workers.
    std::optional<uint64_t> train_tokens;
    const auto splits = meta.find("splits");
    if (splits != meta.end() && splits->is_object() && splits->contains("train") &&
        (*splits)["train"].contains("tokens"))
      train_tokens = (*splits)["train"]["tokens"].get<uint64_t>();
    const auto loss_mask = meta.find("loss_mask");
    check_source(
        field, sources[i].path, train_tokens, cfg,
        loss_mask != meta.end() && loss_mask->is_boolean() && loss_mask->get<bool>(),
        DatasetTokenizer(TokenDataset::tokenizer_path_of(dir.string(), meta), meta["vocab_size"].get<int64_t>()),
        first);
  }
}

TrainingData::~TrainingData() = default;

int64_t TrainingData::vocab_size() const { return sources_.front().data->vocab_size(); }

std::string TrainingData::tokenizer_path() const { return sources_.front().data->tokenizer_path(); }

SampleSource TrainingData::train_samples(uint64_t seed, bool document_windows) const {
  std::vector<const TokenSplit*> splits;
  std::vector<double> shares;
  for (const auto& s : sources_) {
    splits.push_back(&s.data->split("train"));
    shares.push_back(s.share);
  }
  return SampleSource(std::move(splits), shares, seed, document_windows);
}

}  // namespace tide
