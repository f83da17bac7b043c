#include "tide/engine/data/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "bpe_merge.h"
#include "special_token_finder.h"
#include "tide/engine/io/json_input.h"

namespace tide {
namespace {

using json = nlohmann::json;
const char* const kEndOfText = "<|endoftext|>";

// Byte string → the tokenizer.json spelling in GPT-2's byte alphabet.
std::string to_unicode(const std::string& bytes) {
  std::string out;
  for (unsigned char b : bytes) out += byte_to_unicode()[b];
  return out;
}

std::string from_unicode(const std::string& text, const std::string& file) {
  static const std::unordered_map<std::string, unsigned char> inverse = [] {
    std::unordered_map<std::string, unsigned char> m;
    for (int b = 0; b < 256; ++b) m[byte_to_unicode()[b]] = static_cast<unsigned char>(b);
    return m;
  }();
  std::string out;
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : 4;
    const auto it = inverse.find(text.substr(i, n));
    if (it == inverse.end())
      throw std::runtime_error(file + ": token '" + text + "' is not in the byte-level alphabet");
    out += static_cast<char>(it->second);
    i += n;
  }
  return out;
}

}  // namespace

ByteLevelBpe::ByteLevelBpe(std::vector<std::string> tokens, std::vector<std::pair<int32_t, int32_t>> merges,
                     std::vector<std::string> special)
    : tokens_(std::move(tokens)), merges_(std::move(merges)) {
  special_.assign(tokens_.size(), false);
  for (auto& s : special) {
    tokens_.push_back(s);
    special_.push_back(true);
  }
  index();
}

void ByteLevelBpe::index() {
  merge_rank_.clear();
  by_bytes_.clear();
  specials_.clear();
  std::fill(std::begin(byte_ids_), std::end(byte_ids_), -1);
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (special_[i]) specials_.emplace_back(tokens_[i], static_cast<int32_t>(i));
    else by_bytes_.emplace(tokens_[i], static_cast<int32_t>(i));
  }
  for (int b = 0; b < 256; ++b)
    if (const auto it = by_bytes_.find(std::string(1, static_cast<char>(b))); it != by_bytes_.end())
      byte_ids_[b] = it->second;
  std::sort(specials_.begin(), specials_.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (size_t r = 0; r < merges_.size(); ++r) {
    const auto [a, b] = merges_[r];
    const auto it = by_bytes_.find(tokens_.at(a) + tokens_.at(b));
    if (it == by_bytes_.end())
      throw std::runtime_error("merge " + std::to_string(r) + " ('" + to_unicode(tokens_.at(a)) + " " +
                               to_unicode(tokens_.at(b)) + "') produces no vocabulary entry");
    merge_rank_[{a, b}] = {static_cast<int32_t>(r), it->second};
  }
  eos_id_ = bos_id_ = -1;
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (!special_[i]) continue;
    if (eos_id_ < 0 && (tokens_[i] == kEndOfText || tokens_[i] == "</s>" || tokens_[i] == "<|end_of_text|>"))
      eos_id_ = static_cast<int32_t>(i);
    if (bos_id_ < 0 && (tokens_[i] == "<s>" || tokens_[i] == "<|begin_of_text|>")) bos_id_ = static_cast<int32_t>(i);
  }
}

void ByteLevelBpe::add_special_tokens(const std::vector<std::string>& texts) {
  for (const auto& t : texts) {
    bool present = false;
    for (size_t i = 0; i < tokens_.size() && !present; ++i) present = special_[i] && tokens_[i] == t;
    if (present) continue;
    tokens_.push_back(t);
    special_.push_back(true);
  }
  index();
}

ByteLevelBpe ByteLevelBpe::bytes() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  return ByteLevelBpe(std::move(tokens), {}, {kEndOfText});
}

void ByteLevelBpe::save(const std::string& path) const {
  json vocab = json::object();
  json added = json::array();
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (special_[i]) {
      added.push_back({{"id", i}, {"content", tokens_[i]}, {"single_word", false}, {"lstrip", false},
                       {"rstrip", false}, {"normalized", false}, {"special", true}});
      vocab[tokens_[i]] = i;
    } else {
      vocab[to_unicode(tokens_[i])] = i;
    }
  }
  json merges = json::array();
  for (const auto& [a, b] : merges_) merges.push_back(to_unicode(tokens_[a]) + " " + to_unicode(tokens_[b]));
  const json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  const json pre = pre_.to_json();
  const json doc = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", added},
                    {"normalizer", normalizer_.to_json()},
                    {"pre_tokenizer", pre},
                    {"post_processor", nullptr},
                    {"decoder", byte_level},
                    {"model",
                     {{"type", "BPE"},
                      {"dropout", nullptr},
                      {"unk_token", nullptr},
                      {"continuing_subword_prefix", nullptr},
                      {"end_of_word_suffix", nullptr},
                      {"fuse_unk", false},
                      {"byte_fallback", false},
                      {"ignore_merges", ignore_merges_},
                      {"vocab", vocab},
                      {"merges", merges}}}};
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write tokenizer '" + path + "'");
  out << doc.dump() << "\n";
  if (!out.flush()) throw std::runtime_error("cannot write tokenizer '" + path + "'");
}

ByteLevelBpe ByteLevelBpe::load(const std::string& path) {
  const json doc = read_json_file(path);
  try {
    return from_json(doc, path);
  } catch (const json::exception& e) {
    // A field of the wrong type ("type must be string, but is number"): the library's
    // words, and the file's name.
    throw std::runtime_error(path + ": not a tokenizer.json this tide reads (" + json_error_text(e) + ")");
  }
}

ByteLevelBpe ByteLevelBpe::from_json(const json& doc, const std::string& path) {
  if (!doc.is_object()) throw std::runtime_error(path + ": not a JSON tokenizer file");
  const json& model = doc.value("model", json::object());
  if (!model.is_object() || model.value("type", "") != "BPE")
    throw std::runtime_error(path + ": model.type is " +
                             (model.is_object() ? model.value("type", json("?")).dump() : "?") +
                             ", only byte-level BPE tokenizer.json files are supported");
  if (!model.contains("vocab") || !model["vocab"].is_object()) throw std::runtime_error(path + ": model.vocab missing");
  for (const char* field : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (model.contains(field) && !model[field].is_null() && model[field] != "")
      throw std::runtime_error(path + ": model." + field + " is not supported");
  // Hugging Face's conversions of SentencePiece models (Llama 2, Mistral, Gemma) fall back
  // to byte pieces; their repositories ship the model itself beside them.
  if (model.value("byte_fallback", false))
    throw std::runtime_error(path +
                             ": model.byte_fallback is true: a SentencePiece model converted to tokenizer.json (Llama "
                             "2, Mistral and Gemma ship theirs so), which tide reads as the tokenizer.model it came "
                             "from: give that file instead");
  // Ids are int32 and index a table as long as the file has entries: each must lie in
  // [0, entries), so a file cannot ask for more memory than its own size.
  const size_t entries = model["vocab"].size() + doc.value("added_tokens", json::array()).size();
  const auto checked_id = [&](const json& value, const std::string& what) {
    const int64_t id = json_int64(value).value_or(-1);
    if (id < 0 || static_cast<uint64_t>(id) >= entries)
      throw std::runtime_error(path + ": " + what + " has id " + value.dump() + ", not an integer in [0, " +
                               std::to_string(entries) + ") (the number of vocabulary and added entries)");
    return id;
  };
  std::map<int64_t, std::string> special;
  for (const auto& t : doc.value("added_tokens", json::array()))
    special[checked_id(t.at("id"), "added token " + t.at("content").dump())] = t.at("content").get<std::string>();
  int64_t n = 0;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it)
    n = std::max(n, checked_id(it.value(), "vocabulary entry " + json(it.key()).dump()) + 1);
  for (const auto& [id, text] : special) n = std::max(n, id + 1);
  // Every id in [0, n) is one token: a vocabulary entry, an added token, or both under
  // the same id (as files list their special tokens). Two entries under one id, or an
  // id with none, cannot be written back as the same file.
  std::vector<std::string> tokens(static_cast<size_t>(n));
  std::vector<bool> is_special(static_cast<size_t>(n), false), assigned(static_cast<size_t>(n), false);
  std::unordered_map<std::string, int32_t> by_text;
  for (auto it = model["vocab"].begin(); it != model["vocab"].end(); ++it) {
    const int64_t id = it.value().get<int64_t>();
    by_text[it.key()] = static_cast<int32_t>(id);
    if (const auto sp = special.find(id); sp != special.end()) {
      if (sp->second != it.key())
        throw std::runtime_error(path + ": vocabulary entry " + json(it.key()).dump() + " and added token " +
                                 json(sp->second).dump() + " have the same id " + std::to_string(id));
      continue;
    }
    if (assigned[static_cast<size_t>(id)])
      throw std::runtime_error(path + ": vocabulary entries " +
                               json(to_unicode(tokens[static_cast<size_t>(id)])).dump() + " and " +
                               json(it.key()).dump() + " have the same id " + std::to_string(id));
    tokens[static_cast<size_t>(id)] = from_unicode(it.key(), path);
    assigned[static_cast<size_t>(id)] = true;
  }
  for (const auto& [id, text] : special) {
    if (const auto v = model["vocab"].find(text); v != model["vocab"].end() && *v != id)
      throw std::runtime_error(path + ": added token " + json(text).dump() + " has id " + std::to_string(id) +
                               ", its vocabulary entry " + v->dump());
    tokens[static_cast<size_t>(id)] = text;
    is_special[static_cast<size_t>(id)] = assigned[static_cast<size_t>(id)] = true;
  }
  if (const auto gap = std::find(assigned.begin(), assigned.end(), false); gap != assigned.end())
    throw std::runtime_error(path + ": id " + std::to_string(gap - assigned.begin()) +
                             " has no vocabulary entry (ids run to " + std::to_string(n - 1) + ")");
  std::vector<std::pair<int32_t, int32_t>> merges;
  for (const auto& m : model.value("merges", json::array())) {
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const auto sp = s.find(' ');
      if (sp == std::string::npos) throw std::runtime_error(path + ": malformed merge '" + s + "'");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2) {
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      throw std::runtime_error(path + ": malformed merge " + m.dump());
    }
    const auto ia = by_text.find(a), ib = by_text.find(b);
    if (ia == by_text.end() || ib == by_text.end())
      throw std::runtime_error(path + ": merge '" + a + " " + b + "' names a token missing from the vocabulary");
    merges.emplace_back(ia->second, ib->second);
  }
  ByteLevelBpe t;
  t.normalizer_ = Normalizer::from_json(doc.value("normalizer", json()), path);
  t.pre_ = PreTokenizer::from_json(doc.value("pre_tokenizer", json()), path);
  t.ignore_merges_ = model.value("ignore_merges", false);
  t.tokens_ = std::move(tokens);
  t.special_ = std::move(is_special);
  t.merges_ = std::move(merges);
  try {
    t.index();
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": " + e.what());  // a merge whose result is no entry
  }
  return t;
}

void ByteLevelBpe::bytes_to_ids(std::string_view bytes, std::vector<int32_t>& out) const {
  // A byte without a token is dropped, as the tokenizers library drops a character its
  // vocabulary lacks when the model has no unknown token.
  for (const unsigned char c : bytes)
    if (byte_ids_[c] >= 0) out.push_back(byte_ids_[c]);
}

void ByteLevelBpe::encode_chunk(std::string_view chunk, std::vector<int32_t>& out) const {
  std::vector<int32_t> syms;
  syms.reserve(chunk.size());
  bytes_to_ids(chunk, syms);
  // Repeatedly apply the lowest-ranked merge present (the BPE reference algorithm).
  while (syms.size() > 1) {
    int32_t best_rank = INT32_MAX, best_id = -1;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < syms.size(); ++i) {
      const auto it = merge_rank_.find({syms[i], syms[i + 1]});
      if (it != merge_rank_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        best_id = it->second.second;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    merge_pair(syms, {syms[best_at], syms[best_at + 1]}, best_id);
  }
  out.insert(out.end(), syms.begin(), syms.end());
}

std::vector<int32_t> ByteLevelBpe::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  // Special tokens in the text stand for themselves; the stretches between them are
  // pre-tokenised and merged.
  SpecialTokenFinder specials(specials_, text);
  size_t start = 0;
  while (start <= text.size()) {
    const auto [hit, at] = specials.next(start);
    const std::string_view stretch = text.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start);
    // The tokenizers library takes special tokens out first, then normalises what lies
    // between them (its added tokens are "normalized": false, as tide writes them).
    const auto pieces = normalizer_.empty() ? pre_.split(stretch) : pre_.split(normalizer_.apply(stretch));
    for (const auto& piece : pieces) {
      if (merges_.empty()) {
        bytes_to_ids(piece, ids);
        continue;
      }
      if (ignore_merges_) {
        if (const auto whole = by_bytes_.find(piece); whole != by_bytes_.end()) {
          ids.push_back(whole->second);
          continue;
        }
      }
      auto it = cache_.find(piece);
      if (it == cache_.end()) {
        std::vector<int32_t> out;
        encode_chunk(piece, out);
        if (cache_.size() > (1u << 20)) cache_.clear();
        it = cache_.emplace(piece, std::move(out)).first;
      }
      ids.insert(ids.end(), it->second.begin(), it->second.end());
    }
    if (!hit) break;
    ids.push_back(hit->second);
    start = at + hit->first.size();
  }
  return ids;
}

std::string ByteLevelBpe::decode_one(int32_t id) const {
  if (id < 0 || id >= static_cast<int32_t>(tokens_.size())) return "\xEF\xBF\xBD";  // U+FFFD
  return tokens_[static_cast<size_t>(id)];
}

std::string ByteLevelBpe::token_text(int32_t id) const {
  const std::string& bytes = tokens_.at(static_cast<size_t>(id));
  if (special_[static_cast<size_t>(id)]) return bytes;
  return to_unicode(bytes);  // tokenizer.json's form
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (const int32_t id : ids) out += decode_one(id);
  return out;
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open tokenizer '" + path + "'");
  char first = 0;
  in >> first;  // skips whitespace
  if (first == '{') return std::make_unique<ByteLevelBpe>(ByteLevelBpe::load(path));
  return std::make_unique<SentencePieceBpe>(SentencePieceBpe::load(path));
}

void merge_pair(std::vector<int32_t>& syms, const std::pair<int32_t, int32_t>& pair, int32_t id) {
  std::vector<int32_t> merged;
  merged.reserve(syms.size());
  for (size_t i = 0; i < syms.size(); ++i) {
    if (i + 1 < syms.size() && syms[i] == pair.first && syms[i + 1] == pair.second) {
      merged.push_back(id);
      ++i;
    } else {
      merged.push_back(syms[i]);
    }
  }
  syms.swap(merged);
}

}  // namespace tide
