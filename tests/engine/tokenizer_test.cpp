#include <cstdio>
#include <filesystem>

#include <gtest/gtest.h>

#include "tide/engine/data/tokenizer.h"

namespace tide {
namespace {

std::vector<std::string> pretokenize(const std::string& s) { return PreTokenizer::gpt2().split(s); }

TEST(Pretokenize, FollowsGpt2Pattern) {
  EXPECT_EQ((pretokenize("Hello world")), (std::vector<std::string>{"Hello", " world"}));
  EXPECT_EQ((pretokenize("it's 2024!!")), (std::vector<std::string>{"it", "'s", " 2024", "!!"}));
  EXPECT_EQ((pretokenize("a  b")), (std::vector<std::string>{"a", " ", " b"}));
  EXPECT_EQ((pretokenize("a\n\nb")), (std::vector<std::string>{"a", "\n", "\n", "b"}));
  EXPECT_EQ((pretokenize("x   ")), (std::vector<std::string>{"x", "   "}));
  EXPECT_EQ((pretokenize("we'll go")), (std::vector<std::string>{"we", "'ll", " go"}));
  // Unicode classes are exact: curly quotes and dashes are not letters, accents are.
  EXPECT_EQ(pretokenize("na\xC3\xAFve \xE2\x80\x9Cquoted\xE2\x80\x9D \xE2\x80\x94 ok"),
            (std::vector<std::string>{"na\xC3\xAFve", " \xE2\x80\x9C", "quoted", "\xE2\x80\x9D", " \xE2\x80\x94",
                                      " ok"}));
  // Pieces always cover the text exactly.
  const std::string text = "  Mixed: tabs\tand ünïcode, numbers 123abc...\n end ";
  std::string joined;
  for (auto p : pretokenize(text)) joined += p;
  EXPECT_EQ(joined, text);
}

TEST(Tokenizer, BytesRoundTripAnyBytes) {
  const ByteLevelBpe t = ByteLevelBpe::bytes();
  EXPECT_EQ(t.vocab_size(), 257);
  EXPECT_EQ(t.eos_id(), 256);
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_EQ(t.token_text(256), "<|endoftext|>");
  EXPECT_EQ(t.token_text(' '), "\xC4\xA0");  // Ġ, as tokenizer.json stores a space
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const auto ids = t.encode(all);
  ASSERT_EQ(ids.size(), 256u);
  EXPECT_EQ(t.decode(ids), all);
}

TEST(Tokenizer, BpeLearnsFrequentPairsAndRoundTrips) {
  const std::string corpus = "the cat sat on the mat. the cat ate the rat. the the the";
  const ByteLevelBpe t = train_bpe({corpus}, 300);
  // A corpus this small runs out of pairs before 300 ids; training stops there.
  EXPECT_LE(t.vocab_size(), 300);
  EXPECT_EQ(t.vocab_size(), 257 + static_cast<int64_t>(t.merge_count()));
  EXPECT_GT(t.merge_count(), 0u);
  const auto ids = t.encode(" the cat");
  EXPECT_LT(ids.size(), std::string(" the cat").size());
  EXPECT_EQ(t.decode(ids), " the cat");
  const std::string unseen = "zebra ünïcode \x01\xff";
  EXPECT_EQ(t.decode(t.encode(unseen)), unseen);
}

TEST(Tokenizer, TrainingIsDeterministic) {
  const std::string corpus = "abc abd abe bcd bce cde abc abc bcd";
  const ByteLevelBpe a = train_bpe({corpus}, 270), b = train_bpe({corpus}, 270);
  EXPECT_EQ(a.encode(corpus), b.encode(corpus));
}

TEST(Tokenizer, SavesAndLoadsHuggingFaceJson) {
  const std::string corpus = "In the beginning God created the heaven and the earth. And the earth was without form";
  const ByteLevelBpe t = train_bpe({corpus}, 290);
  const auto path = std::filesystem::temp_directory_path() / "tide_tok_test.json";
  t.save(path.string());
  const ByteLevelBpe u = ByteLevelBpe::load(path.string());
  EXPECT_EQ(u.vocab_size(), t.vocab_size());
  EXPECT_EQ(u.eos_id(), t.eos_id());
  EXPECT_EQ(u.encode(corpus), t.encode(corpus));
  std::filesystem::remove(path);
}

TEST(Tokenizer, LoadRejectsOtherModelsByName) {
  const auto path = std::filesystem::temp_directory_path() / "tide_tok_wordpiece.json";
  FILE* f = std::fopen(path.c_str(), "w");
  std::fputs(R"({"model": {"type": "WordPiece", "vocab": {}}})", f);
  std::fclose(f);
  try {
    ByteLevelBpe::load(path.string());
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("WordPiece"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tide
