#include <string>
#include <vector>

#include "tide/engine/data/tokenizer.h"

namespace tide {
namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::vector<std::string> build() {
  // Printable bytes map to themselves; the other 68 to U+0100 onwards, in byte order.
  std::vector<std::string> table(256);
  uint32_t extra = 0;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    table[b] = utf8(printable ? b : 256 + extra++);
  }
  return table;
}

}  // namespace

const std::vector<std::string>& byte_to_unicode() {
  static const std::vector<std::string> table = build();
  return table;
}

}  // namespace tide
