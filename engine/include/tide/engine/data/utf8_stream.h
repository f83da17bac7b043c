// Bytes decoded token by token, printed as valid UTF-8. A byte-level tokenizer's pieces
// may split a character between tokens, and a model may emit bytes that form none:
// the first wait for their rest, the second become U+FFFD, one for each maximal
// subpart of an ill-formed sequence (the Unicode Standard's substitution practice, as
// Python's and Hugging Face's decoders apply it).
#pragma once

#include <string>
#include <string_view>

namespace tide {

class Utf8Stream {
 public:
  // The text `bytes` completes; an unfinished character at its end is held back.
  std::string push(std::string_view bytes);
  // The held-back bytes, as U+FFFD if any: the stream has ended.
  std::string finish();

 private:
  std::string pending_;                        // the lead byte and continuation bytes of a character so far
  int needed_ = 0;                             // continuation bytes still to come
  unsigned char lower_ = 0x80, upper_ = 0xBF;  // the next continuation byte's range
};

}  // namespace tide
