// UTF-8 as the Unicode Standard defines it well formed: no overlong forms, no surrogates,
// nothing above U+10FFFF. JSON strings must be so (nlohmann refuses to write others), and
// decoded model output is made so (data/utf8_stream.h).
#pragma once

#include <cstddef>
#include <string_view>

namespace tide {

// What a byte asks of the bytes after it when it starts a character: how many
// continuation bytes follow (0 for ASCII, -1 when it cannot start one: a continuation
// byte, C0, C1, F5-FF) and the range of the first of them (E0, ED, F0 and F4 narrow it).
struct Utf8Lead {
  int continuation = -1;
  unsigned char lower = 0x80, upper = 0xBF;
};
Utf8Lead utf8_lead(unsigned char b);

// The code point of the well-formed sequence that starts at text[i], and its length in
// bytes; a byte that starts none is U+FFFD of length 1.
struct Utf8Char {
  char32_t code_point;
  std::size_t length;
};
Utf8Char utf8_char_at(std::string_view text, std::size_t i);

// The offset of the first byte of `text` that is not part of a well-formed sequence, or
// npos.
std::size_t first_non_utf8(std::string_view text);

}  // namespace tide
