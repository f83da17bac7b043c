// Where the special tokens of a text are, for the tokenizers that take them out before
// encoding what lies between (internal).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tide {

// The special tokens `text` holds, leftmost first (the earlier in `tokens` where two
// start together: tokenizers list theirs longest first). Each token's next place is kept
// until the text before it has been consumed, so a text costs one scan for each kind of
// token, not one for each kind at every occurrence (Llama 3 lists 256). Empty texts never
// match.
class SpecialTokenFinder {
 public:
  using Token = std::pair<std::string, int32_t>;
  SpecialTokenFinder(const std::vector<Token>& tokens, std::string_view text) : tokens_(tokens), text_(text) {
    next_.reserve(tokens.size());
    for (const auto& t : tokens) next_.push_back(t.first.empty() ? std::string_view::npos : text.find(t.first));
  }
  // The first token at or after `start`, and where it starts; null and npos when none.
  std::pair<const Token*, size_t> next(size_t start) {
    const Token* hit = nullptr;
    size_t at = std::string_view::npos;
    for (size_t i = 0; i < tokens_.size(); ++i) {
      if (next_[i] != std::string_view::npos && next_[i] < start) next_[i] = text_.find(tokens_[i].first, start);
      if (next_[i] < at) at = next_[i], hit = &tokens_[i];
    }
    return {hit, at};
  }

 private:
  const std::vector<Token>& tokens_;
  std::string_view text_;
  std::vector<size_t> next_;
};

}  // namespace tide
