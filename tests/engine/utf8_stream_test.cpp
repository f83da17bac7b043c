// tide generate's output: bytes token by token, printed as valid UTF-8.
#include <gtest/gtest.h>

#include "tide/engine/data/utf8_stream.h"
#include "tide/engine/io/utf8.h"

namespace tide {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

std::string whole(std::string_view bytes) {
  Utf8Stream s;
  std::string out = s.push(bytes);
  return out + s.finish();
}

TEST(Utf8Stream, ACharacterSplitBetweenPiecesWaitsForItsRest) {
  const std::string text = "h\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80.";  // "hé € 😀."
  Utf8Stream s;
  std::string out;
  for (size_t i = 0; i < text.size(); ++i) {
    const std::string piece = s.push(text.substr(i, 1));
    // Nothing of a character is printed before its last byte has come.
    const auto last = static_cast<unsigned char>(text[i]);
    const bool completes =
        last < 0x80 || i + 1 == text.size() || (static_cast<unsigned char>(text[i + 1]) & 0xC0) != 0x80;
    EXPECT_EQ(piece.empty(), !completes) << "byte " << i;
    out += piece;
  }
  EXPECT_EQ(s.finish(), "");
  EXPECT_EQ(out, text);
}

TEST(Utf8Stream, EachMaximalSubpartOfAnIllFormedSequenceIsOneReplacement) {
  // The Unicode Standard's practice (chapter 3, "U+FFFD Substitution of Maximal
  // Subparts"), which Python's bytes.decode("utf-8", "replace") follows.
  EXPECT_EQ(whole("\xB2"), kFffd);                                      // a continuation byte alone
  EXPECT_EQ(whole("a\xC3"), "a" + kFffd);                               // cut off at the end
  EXPECT_EQ(whole("\xE0\x80"), kFffd + kFffd);                          // overlong: E0 needs A0-BF next
  EXPECT_EQ(whole("\xC0\xAF"), kFffd + kFffd);                          // C0 never leads
  EXPECT_EQ(whole("\xED\xA0\x80"), kFffd + kFffd + kFffd);              // a surrogate
  EXPECT_EQ(whole("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // above U+10FFFF
  EXPECT_EQ(whole("\xF0\x9F\x98"
                  "A"),
            kFffd + "A");  // three of four bytes: one subpart
  EXPECT_EQ(whole("\xFF\xFE"), kFffd + kFffd);
  EXPECT_EQ(whole("\xE2\x82\xAC\xF0\x9F\x98\x80"), "\xE2\x82\xAC\xF0\x9F\x98\x80");  // valid: unchanged
}

TEST(Utf8Stream, AStreamGoesOnAfterAReplacement) {
  Utf8Stream s;
  EXPECT_EQ(s.push("\xE2\x82"), "");
  EXPECT_EQ(s.push("x\xC3"), kFffd + "x");
  EXPECT_EQ(s.push("\xA9"), "\xC3\xA9");
  EXPECT_EQ(s.finish(), "");
  EXPECT_EQ(s.push("\xF0"), "");
  EXPECT_EQ(s.finish(), kFffd);
}

}  // namespace
}  // namespace tide

namespace tide {
namespace {

// One code point at a time, as the chat templates' trim reads text; what starts no
// well-formed sequence (a stray continuation, a cut-off or overlong form, a surrogate) is
// U+FFFD of one byte.
TEST(Utf8CharAt, DecodesWellFormedSequencesAndReplacesTheRest) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";  // a, e-acute, euro, emoji
  EXPECT_EQ(utf8_char_at(text, 0).code_point, U'a');
  EXPECT_EQ(utf8_char_at(text, 1).code_point, U'\u00E9');
  EXPECT_EQ(utf8_char_at(text, 1).length, 2u);
  EXPECT_EQ(utf8_char_at(text, 3).code_point, U'\u20AC');
  EXPECT_EQ(utf8_char_at(text, 3).length, 3u);
  EXPECT_EQ(utf8_char_at(text, 6).code_point, U'\U0001F600');
  EXPECT_EQ(utf8_char_at(text, 6).length, 4u);
  for (const std::string bad : {"\x80", "\xC3", "\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80"}) {
    EXPECT_EQ(utf8_char_at(bad, 0).code_point, U'\uFFFD') << bad.size();
    EXPECT_EQ(utf8_char_at(bad, 0).length, 1u);
  }
}

}  // namespace
}  // namespace tide
