// Byte-level BPE training: count pre-tokenised chunks, then merge the most frequent
// adjacent pair until the vocabulary is full, updating only the chunks that hold it.
#include <map>
#include <queue>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "tide/engine/data/tokenizer.h"
#include "bpe_merge.h"

namespace tide {
namespace {

using Pair = std::pair<int32_t, int32_t>;

struct PairHash {
  size_t operator()(const Pair& p) const {
    return std::hash<uint64_t>()((static_cast<uint64_t>(static_cast<uint32_t>(p.first)) << 32) |
                                 static_cast<uint32_t>(p.second));
  }
};

struct Word {
  std::vector<int32_t> syms;
  int64_t count;
};

// The distinct pre-tokenised chunks of the texts as byte symbols, with their counts,
// sorted for determinism regardless of hash order.
std::vector<Word> count_words(const std::vector<std::string_view>& texts) {
  // The same pre-tokenisation the trained tokenizer will use (GPT-2's).
  const PreTokenizer pre = PreTokenizer::gpt2();
  std::unordered_map<std::string, int64_t> counts;
  for (const auto text : texts)
    for (auto& chunk : pre.split(text)) ++counts[std::move(chunk)];
  std::map<std::string, int64_t> sorted(counts.begin(), counts.end());
  std::vector<Word> words;
  words.reserve(sorted.size());
  for (const auto& [chunk, n] : sorted) {
    Word w{{}, n};
    for (unsigned char c : chunk) w.syms.push_back(c);
    words.push_back(std::move(w));
  }
  return words;
}

}  // namespace

ByteLevelBpe train_bpe(const std::vector<std::string_view>& texts, int64_t vocab_size,
                    const std::function<void(int64_t, int64_t)>& progress) {
  if (vocab_size < 257)
    throw std::invalid_argument("vocab size " + std::to_string(vocab_size) +
                                " is below 257 (256 byte tokens + end-of-text)");
  std::vector<Word> words = count_words(texts);

  std::unordered_map<Pair, int64_t, PairHash> pair_count;
  std::unordered_map<Pair, std::set<size_t>, PairHash> where;
  for (size_t wi = 0; wi < words.size(); ++wi) {
    const auto& s = words[wi].syms;
    for (size_t i = 0; i + 1 < s.size(); ++i) {
      pair_count[{s[i], s[i + 1]}] += words[wi].count;
      where[{s[i], s[i + 1]}].insert(wi);
    }
  }
  // Max-heap on (count, then the smaller pair); stale entries are skipped on pop.
  struct Entry {
    int64_t count;
    Pair pair;
    bool operator<(const Entry& o) const { return count != o.count ? count < o.count : pair > o.pair; }
  };
  std::priority_queue<Entry> heap;
  for (const auto& [p, n] : pair_count) heap.push({n, p});

  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  std::vector<Pair> merges;
  const int64_t target = vocab_size - 257;
  auto add = [&](const Pair& p, int64_t delta, size_t wi) {
    int64_t& n = pair_count[p];
    n += delta;
    if (delta > 0) where[p].insert(wi);
    if (n > 0) heap.push({n, p});
  };
  while (static_cast<int64_t>(merges.size()) < target && !heap.empty()) {
    const Entry top = heap.top();
    heap.pop();
    const auto it = pair_count.find(top.pair);
    if (it == pair_count.end() || it->second != top.count || top.count <= 0) continue;
    const Pair best = top.pair;
    const int32_t id = static_cast<int32_t>(tokens.size());
    tokens.push_back(tokens[best.first] + tokens[best.second]);
    merges.push_back(best);
    const std::set<size_t> affected = std::move(where[best]);
    where.erase(best);
    for (const size_t wi : affected) {
      auto& s = words[wi].syms;
      const int64_t c = words[wi].count;
      for (size_t i = 0; i + 1 < s.size(); ++i) add({s[i], s[i + 1]}, -c, wi);
      merge_pair(s, best, id);
      for (size_t i = 0; i + 1 < s.size(); ++i) add({s[i], s[i + 1]}, c, wi);
    }
    pair_count.erase(best);
    if (progress && merges.size() % 256 == 0) progress(static_cast<int64_t>(merges.size()), target);
  }
  if (progress) progress(static_cast<int64_t>(merges.size()), target);
  // A corpus too small for the requested vocabulary stops early; the vocabulary is
  // then smaller than asked, which the caller reports.
  return ByteLevelBpe(std::move(tokens), std::move(merges), {"<|endoftext|>"});
}

}  // namespace tide
