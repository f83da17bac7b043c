#include "tide/engine/data/utf8_stream.h"

namespace tide {
namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (needed_ == 0) {
      // The lead byte fixes the length and, for E0, ED, F0 and F4, a narrower range of
      // the next byte: no overlong forms, no surrogates, nothing above U+10FFFF.
      if (b < 0x80) {
        out += static_cast<char>(b);
        continue;
      }
      if (b >= 0xC2 && b <= 0xDF) {
        needed_ = 1;
      } else if (b >= 0xE0 && b <= 0xEF) {
        needed_ = 2;
        if (b == 0xE0) lower_ = 0xA0;
        if (b == 0xED) upper_ = 0x9F;
      } else if (b >= 0xF0 && b <= 0xF4) {
        needed_ = 3;
        if (b == 0xF0) lower_ = 0x90;
        if (b == 0xF4) upper_ = 0x8F;
      } else {
        out += kReplacement;  // a continuation byte without a lead, or C0, C1, F5-FF
        continue;
      }
      pending_.assign(1, static_cast<char>(b));
      continue;
    }
    if (b < lower_ || b > upper_) {
      // The character so far is one maximal subpart; this byte starts afresh.
      out += kReplacement;
      pending_.clear();
      needed_ = 0;
      lower_ = 0x80;
      upper_ = 0xBF;
      --i;
      continue;
    }
    lower_ = 0x80;
    upper_ = 0xBF;
    pending_ += static_cast<char>(b);
    if (--needed_ == 0) {
      out += pending_;
      pending_.clear();
    }
  }
  return out;
}

std::string Utf8Stream::finish() {
  if (needed_ == 0) return "";
  pending_.clear();
  needed_ = 0;
  lower_ = 0x80;
  upper_ = 0xBF;
  return std::string(kReplacement);
}

}  // namespace tide
