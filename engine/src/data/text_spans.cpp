#include "tide/engine/data/text_spans.h"

#include <algorithm>

#include "tide/engine/data/tokenizer.h"

namespace tide {

namespace {

// The spans [begin, end) as encode_spans describes, appended to `out`.
void encode_run(const Tokenizer& tokenizer, const TextSpan* begin, const TextSpan* end, CountedIds& out) {
  std::string whole;
  for (const TextSpan* s = begin; s != end; ++s) whole += s->text;
  const std::vector<int32_t> ids = tokenizer.encode(whole);
  std::vector<uint8_t> counted(ids.size(), 0);
  size_t edge = 0, from = 0;  // the text and the ids before the current span
  for (const TextSpan* s = begin; s != end; ++s) {
    edge += s->text.size();
    const TextSpan* next = s + 1;
    if (next != end && next->counted == s->counted) continue;  // they share one run of ids
    size_t to = ids.size();
    if (next != end) {
      const std::vector<int32_t> before = tokenizer.encode(std::string_view(whole).substr(0, edge));
      to = static_cast<size_t>(std::mismatch(before.begin(), before.end(), ids.begin(), ids.end()).first -
                               before.begin());
      to = std::max(to, from);
    }
    if (s->counted)
      std::fill(counted.begin() + static_cast<std::ptrdiff_t>(from), counted.begin() + static_cast<std::ptrdiff_t>(to),
                1);
    from = to;
  }
  out.ids.insert(out.ids.end(), ids.begin(), ids.end());
  out.counted.insert(out.counted.end(), counted.begin(), counted.end());
}

}  // namespace

CountedIds encode_spans(const Tokenizer& tokenizer, const std::vector<TextSpan>& spans) {
  CountedIds out;
  // Each run from a span that starts at a special token to the next such encodes apart:
  // the tokenizer would split the whole text there anyway.
  const TextSpan* run = spans.data();
  const TextSpan* const end = spans.data() + spans.size();
  for (const TextSpan* s = run; s != end; ++s)
    if (s != run && s->starts_at_special) {
      encode_run(tokenizer, run, s, out);
      run = s;
    }
  if (run != end) encode_run(tokenizer, run, end, out);
  return out;
}

}  // namespace tide
