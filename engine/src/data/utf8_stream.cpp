#include "tide/engine/data/utf8_stream.h"

#include "tide/engine/io/utf8.h"

namespace tide {
namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
}  // namespace

std::string Utf8Stream::push(std::string_view bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (needed_ == 0) {
      const Utf8Lead lead = utf8_lead(b);
      if (lead.continuation == 0) {
        out += static_cast<char>(b);
        continue;
      }
      if (lead.continuation < 0) {
        out += kReplacement;  // a continuation byte without a lead, or C0, C1, F5-FF
        continue;
      }
      needed_ = lead.continuation;
      lower_ = lead.lower;
      upper_ = lead.upper;
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
