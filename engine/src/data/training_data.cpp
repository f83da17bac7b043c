#include "tide/engine/data/training_data.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "tide/engine/config_schema.h"

namespace tide {
namespace {
// A tokenizer file's bytes; "" when there is none.
std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}
}  // namespace

TrainingData::TrainingData(const DataConfig& cfg) {
  const auto sources = data_sources(cfg);
  double total = 0;
  for (const auto& s : sources) total += s.weight;
  std::string first_tokenizer;
  for (size_t i = 0; i < sources.size(); ++i) {
    const std::string field = cfg.blend.empty() ? "data.path" : fmt::format("data.blend[{}]", i + 1);
    const DataSource& s = sources[i];
    if (s.path.empty()) throw ConfigError(field, "no dataset: name the directory `tide data prepare` wrote");
    Source source{s.name, s.weight / total, nullptr};
    try {
      source.data = std::make_unique<TokenDataset>(s.path);  // its errors name the file
    } catch (const std::exception& e) {
      throw ConfigError(field, e.what());
    }
    try {
      require_window(source.data->split("train"), cfg.seq_len);
    } catch (const std::exception& e) {
      throw ConfigError(field, fmt::format("{}: its train split: {}", s.path, e.what()));
    }
    const std::string tokenizer = file_bytes(source.data->tokenizer_path());
    if (i == 0) {
      first_tokenizer = tokenizer;
    } else if (tokenizer != first_tokenizer || source.data->vocab_size() != sources_[0].data->vocab_size()) {
      throw ConfigError(field, fmt::format("{}: its tokenizer ({}, {} ids) is not data.blend[1]'s ({}, {} ids): the "
                                           "same id would be another token; prepare every dataset of a blend with "
                                           "one tokenizer (tide data prepare --tokenizer FILE)",
                                           s.path, source.data->tokenizer_path(), source.data->vocab_size(),
                                           sources_[0].data->tokenizer_path(), sources_[0].data->vocab_size()));
    }
    sources_.push_back(std::move(source));
  }
}

TrainingData::~TrainingData() = default;

int64_t TrainingData::vocab_size() const { return sources_.front().data->vocab_size(); }

std::string TrainingData::tokenizer_path() const { return sources_.front().data->tokenizer_path(); }

SampleSource TrainingData::train_samples(uint64_t seed) const {
  std::vector<const TokenSplit*> splits;
  std::vector<double> shares;
  for (const auto& s : sources_) {
    splits.push_back(&s.data->split("train"));
    shares.push_back(s.share);
  }
  return SampleSource(std::move(splits), shares, seed);
}

}  // namespace tide
