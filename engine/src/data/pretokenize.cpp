#include "tide/engine/data/tokenizer.h"

namespace tide {
namespace {

enum class Cls { Space, Letter, Digit, Other };

// Byte length of the UTF-8 sequence starting with c (1 for stray continuation bytes).
size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

Cls classify(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f') return Cls::Space;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80) return Cls::Letter;
  if (c >= '0' && c <= '9') return Cls::Digit;
  return Cls::Other;
}

size_t next(std::string_view s, size_t i) { return std::min(s.size(), i + utf8_len(static_cast<unsigned char>(s[i]))); }

size_t contraction(std::string_view s, size_t i) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  const char a = s[i + 1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 < s.size()) {
    const char b = s[i + 2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

}  // namespace

std::vector<std::string_view> pretokenize(std::string_view s) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < s.size()) {
    if (size_t n = contraction(s, i)) {
      out.push_back(s.substr(i, n));
      i += n;
      continue;
    }
    size_t j = i;
    // " ?\p{L}+ | ?\p{N}+ | ?[^\s\p{L}\p{N}]+": one optional leading space.
    if (s[i] == ' ' && i + 1 < s.size() && classify(s, i + 1) != Cls::Space) j = i + 1;
    const Cls c = classify(s, j);
    if (c != Cls::Space) {
      size_t k = next(s, j);
      while (k < s.size() && classify(s, k) == c) k = next(s, k);
      out.push_back(s.substr(i, k - i));
      i = k;
      continue;
    }
    // "\s+(?!\S)|\s+": a whitespace run leaves its last character to the next word.
    size_t k = i;
    while (k < s.size() && classify(s, k) == Cls::Space) ++k;
    if (k < s.size() && k - i >= 2) --k;
    out.push_back(s.substr(i, k - i));
    i = k;
  }
  return out;
}

}  // namespace tide
