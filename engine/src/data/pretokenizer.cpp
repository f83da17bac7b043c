#include "tide/engine/data/pretokenizer.h"

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <stdexcept>

#include <nlohmann/json.hpp>
#include <unicode/uregex.h>
#include <unicode/ustring.h>
#include <unicode/utext.h>

namespace tide {

const char* const kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

enum class Behavior { Isolated, Removed, MergedWithPrevious, MergedWithNext };

// A compiled ICU pattern. ICU matchers carry state, so uses are serialised.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& file) : pattern_(pattern), file_(file) {
    UErrorCode status = U_ZERO_ERROR;
    std::vector<UChar> u16(pattern.size() + 1);
    int32_t len = 0;
    u_strFromUTF8(u16.data(), static_cast<int32_t>(u16.size()), &len, pattern.data(),
                  static_cast<int32_t>(pattern.size()), &status);
    UParseError pe{};
    if (U_SUCCESS(status)) re_ = uregex_open(u16.data(), len, 0, &pe, &status);
    if (U_FAILURE(status))
      throw std::runtime_error(file + ": pre-tokenizer pattern '" + pattern + "' does not compile (" +
                               u_errorName(status) + " at offset " + std::to_string(pe.offset) + ")");
  }
  ~Regex() { uregex_close(re_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Byte ranges [begin, end) of every match in UTF-8 text.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const {
    std::lock_guard<std::mutex> lock(mu_);
    UErrorCode status = U_ZERO_ERROR;
    UText* ut = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()), &status);
    uregex_setUText(re_, ut, &status);
    // A pattern from a file bounds its own time: backtracking can take exponentially
    // long ("(a*)*b"). ICU counts in ticks of 10,000 match steps, per search; the limit
    // allows 1,000 steps a byte of the text, far beyond what any tokenizer's pattern
    // needs, on top of 10^7.
    uregex_setTimeLimit(re_, static_cast<int32_t>(std::min<size_t>(1000 + text.size() / 10, INT32_MAX)), &status);
    std::vector<std::pair<size_t, size_t>> out;
    while (U_SUCCESS(status) && uregex_findNext(re_, &status)) {
      const int64_t b = uregex_start64(re_, 0, &status), e = uregex_end64(re_, 0, &status);
      if (e > b) out.emplace_back(static_cast<size_t>(b), static_cast<size_t>(e));
    }
    uregex_setText(re_, u"", 0, &status);  // drop the reference to `text`
    utext_close(ut);
    if (status == U_REGEX_TIME_OUT)
      throw std::runtime_error(file_ + ": pre-tokenizer pattern '" + pattern_ + "' takes too long on a text of " +
                               std::to_string(text.size()) + " bytes (it backtracks without bound)");
    if (U_FAILURE(status))
      throw std::runtime_error(file_ + ": pre-tokenizer pattern '" + pattern_ + "' failed: " + u_errorName(status));
    return out;
  }

 private:
  std::string pattern_, file_;
  URegularExpression* re_ = nullptr;
  mutable std::mutex mu_;
};

}  // namespace

struct PreTokenizer::Step {
  std::unique_ptr<Regex> re;  // null: a literal delimiter
  std::string literal;
  Behavior behavior = Behavior::Isolated;
  bool add_prefix_space = false;  // ByteLevel only

  std::vector<std::pair<size_t, size_t>> matches(std::string_view s) const {
    if (re) return re->find_all(s);
    std::vector<std::pair<size_t, size_t>> out;
    if (literal.empty()) return out;
    for (size_t at = s.find(literal); at != std::string_view::npos; at = s.find(literal, at + literal.size()))
      out.emplace_back(at, at + literal.size());
    return out;
  }

  void apply(std::string_view s, std::vector<std::string>& out) const {
    std::string prefixed;
    if (add_prefix_space && !s.empty() && s[0] != ' ') {
      prefixed = " " + std::string(s);
      s = prefixed;
    }
    size_t last = 0;
    std::string carry;  // MergedWithNext: a delimiter waiting for what follows
    auto emit = [&](std::string piece) {
      if (!carry.empty()) {
        piece = carry + piece;
        carry.clear();
      }
      if (!piece.empty()) out.push_back(std::move(piece));
    };
    for (const auto& [b, e] : matches(s)) {
      const std::string gap(s.substr(last, b - last));
      const std::string match(s.substr(b, e - b));
      switch (behavior) {
        case Behavior::Isolated:
          emit(gap);
          emit(match);
          break;
        case Behavior::Removed: emit(gap); break;
        case Behavior::MergedWithPrevious: emit(gap + match); break;
        case Behavior::MergedWithNext:
          emit(gap);
          carry = match;
          break;
      }
      last = e;
    }
    emit(std::string(s.substr(last)));
    if (!carry.empty()) out.push_back(carry);
  }
};

PreTokenizer PreTokenizer::gpt2() {
  return from_json({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}},
                   "built-in");
}

PreTokenizer PreTokenizer::from_json(const nlohmann::json& spec, const std::string& file) {
  PreTokenizer p;
  p.spec_ = spec.dump();
  bool byte_level = false;
  const std::function<void(const nlohmann::json&)> add = [&](const nlohmann::json& s) {
    const std::string type = s.is_object() ? s.value("type", "") : "";
    if (type == "Sequence") {
      for (const auto& inner : s.value("pretokenizers", nlohmann::json::array())) add(inner);
    } else if (type == "ByteLevel") {
      byte_level = true;
      auto step = std::make_shared<Step>();
      step->add_prefix_space = s.value("add_prefix_space", false);
      if (s.value("use_regex", true)) step->re = std::make_unique<Regex>(kGpt2SplitPattern, file);
      if (step->re || step->add_prefix_space) p.steps_.push_back(step);
    } else if (type == "Split") {
      auto step = std::make_shared<Step>();
      const auto& pat = s.value("pattern", nlohmann::json::object());
      if (pat.contains("Regex")) step->re = std::make_unique<Regex>(pat["Regex"].get<std::string>(), file);
      else if (pat.contains("String")) step->literal = pat["String"].get<std::string>();
      else throw std::runtime_error(file + ": Split pre-tokenizer without a Regex or String pattern");
      if (s.value("invert", false)) throw std::runtime_error(file + ": Split with invert = true is not supported");
      const std::string b = s.value("behavior", "Isolated");
      if (b == "Isolated") step->behavior = Behavior::Isolated;
      else if (b == "Removed") step->behavior = Behavior::Removed;
      else if (b == "MergedWithPrevious") step->behavior = Behavior::MergedWithPrevious;
      else if (b == "MergedWithNext") step->behavior = Behavior::MergedWithNext;
      else throw std::runtime_error(file + ": Split behavior '" + b + "' is not supported");
      p.steps_.push_back(step);
    } else {
      throw std::runtime_error(file + ": pre-tokenizer " + (s.is_object() ? "'" + type + "'" : s.dump()) +
                               " is not supported (ByteLevel, Split and Sequence are)");
    }
  };
  if (!spec.is_null()) add(spec);
  // Without it the tokenizers library looks the text's own characters up in a vocabulary
  // spelled in GPT-2's byte alphabet, and tide's ids would differ from its ids.
  if (!byte_level)
    throw std::runtime_error(file + ": pre-tokenizer " + (spec.is_null() ? std::string("null") : spec.dump()) +
                             " has no ByteLevel step; tide reads byte-level BPE tokenizer.json files only");
  return p;
}

nlohmann::json PreTokenizer::to_json() const { return nlohmann::json::parse(spec_); }

std::vector<std::string> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string> pieces{std::string(text)};
  for (const auto& step : steps_) {
    std::vector<std::string> next;
    for (const auto& piece : pieces) step->apply(piece, next);
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace tide
