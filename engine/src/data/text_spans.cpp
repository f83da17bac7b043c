#include "tide/engine/data/text_spans.h"

#include <algorithm>

#include "tide/engine/data/tokenizer.h"

namespace tide {

CountedIds encode_spans(const Tokenizer& tokenizer, const std::vector<TextSpan>& spans) {
  std::string whole;
  for (const auto& s : spans) whole += s.text;
  CountedIds out;
  out.ids = tokenizer.encode(whole);
  out.counted.assign(out.ids.size(), 0);
  size_t edge = 0, from = 0;  // the text and the ids before the current span
  for (size_t i = 0; i < spans.size(); ++i) {
    size_t to = out.ids.size();
    edge += spans[i].text.size();
    // Only an edge between spans that count differently needs finding.
    if (i + 1 < spans.size() && spans[i + 1].counted != spans[i].counted) {
      const std::vector<int32_t> before = tokenizer.encode(std::string_view(whole).substr(0, edge));
      to = static_cast<size_t>(std::mismatch(before.begin(), before.end(), out.ids.begin(), out.ids.end()).first -
                               before.begin());
      to = std::max(to, from);
    } else if (i + 1 < spans.size()) {
      continue;  // the next span counts alike: they share one run of ids
    }
    if (spans[i].counted)
      std::fill(out.counted.begin() + static_cast<std::ptrdiff_t>(from),
                out.counted.begin() + static_cast<std::ptrdiff_t>(to), 1);
    from = to;
  }
  return out;
}

}  // namespace tide
