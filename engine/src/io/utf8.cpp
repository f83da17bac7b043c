#include "tide/engine/io/utf8.h"

namespace tide {

Utf8Lead utf8_lead(unsigned char b) {
  if (b < 0x80) return {0};
  if (b >= 0xC2 && b <= 0xDF) return {1};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {2};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  if (b >= 0xF1 && b <= 0xF3) return {3};
  return {};
}

Utf8Char utf8_char_at(std::string_view text, std::size_t i) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const Utf8Lead lead = utf8_lead(b[i]);
  if (lead.continuation < 0 || text.size() - i <= static_cast<std::size_t>(lead.continuation)) return {0xFFFD, 1};
  char32_t c = lead.continuation == 0 ? b[i] : b[i] & (0x3F >> lead.continuation);
  for (int k = 1; k <= lead.continuation; ++k) {
    const unsigned char lower = k == 1 ? lead.lower : 0x80, upper = k == 1 ? lead.upper : 0xBF;
    if (b[i + k] < lower || b[i + k] > upper) return {0xFFFD, 1};
    c = (c << 6) | (b[i + k] & 0x3F);
  }
  return {c, static_cast<std::size_t>(lead.continuation) + 1};
}

std::size_t first_non_utf8(std::string_view text) {
  const auto* b = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t n = text.size();
  for (std::size_t i = 0; i < n;) {
    const Utf8Lead lead = utf8_lead(b[i]);
    if (lead.continuation < 0 || n - i <= static_cast<std::size_t>(lead.continuation)) return i;
    for (int k = 1; k <= lead.continuation; ++k) {
      const unsigned char lower = k == 1 ? lead.lower : 0x80, upper = k == 1 ? lead.upper : 0xBF;
      if (b[i + k] < lower || b[i + k] > upper) return i;
    }
    i += static_cast<std::size_t>(lead.continuation) + 1;
  }
  return std::string_view::npos;
}

}  // namespace tide
