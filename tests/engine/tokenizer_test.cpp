#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

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

// A byte-level tokenizer.json whose fields `edit` changes, at a path of its own.
std::string edited_tokenizer(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
  const auto path = (std::filesystem::temp_directory_path() / (name + std::to_string(::getpid()) + ".json")).string();
  ByteLevelBpe::bytes().save(path);
  std::ifstream in(path);
  nlohmann::json j = nlohmann::json::parse(in);
  edit(j);
  std::ofstream(path, std::ios::trunc) << j.dump();
  return path;
}

std::string load_error(const std::string& path) {
  try {
    load_tokenizer(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST(Tokenizer, IdsOutsideTheFilesEntriesAreRefused) {
  // A negative id wrote before the table, a huge one asked for its size in memory
  // (found by tests/fuzz).
  for (const int64_t id : {int64_t{-1}, int64_t{1} << 40}) {
    const auto path = edited_tokenizer("tide_tok_id", [&](nlohmann::json& j) { j["model"]["vocab"]["a"] = id; });
    const std::string e = load_error(path);
    EXPECT_NE(e.find(path + ": vocabulary entry \"a\" has id " + std::to_string(id) + ", not an integer in [0, 258)"),
              std::string::npos)
        << e;
    std::filesystem::remove(path);
  }
}

TEST(Tokenizer, TwoEntriesUnderOneIdAndIdsWithoutEntriesAreRefused) {
  auto path = edited_tokenizer("tide_tok_twice", [](nlohmann::json& j) { j["model"]["vocab"]["b"] = 97; });
  EXPECT_NE(load_error(path).find("vocabulary entries \"a\" and \"b\" have the same id 97"), std::string::npos)
      << load_error(path);
  std::filesystem::remove(path);
  path = edited_tokenizer("tide_tok_gap", [](nlohmann::json& j) { j["model"]["vocab"].erase("a"); });
  EXPECT_NE(load_error(path).find("id 97 has no vocabulary entry"), std::string::npos) << load_error(path);
  std::filesystem::remove(path);
}

TEST(Tokenizer, AFieldOfTheWrongTypeNamesTheFile) {
  const auto path = edited_tokenizer("tide_tok_type", [](nlohmann::json& j) { j["model"]["vocab"]["a"] = "97"; });
  EXPECT_NE(load_error(path).find(path + ": vocabulary entry \"a\" has id \"97\""), std::string::npos)
      << load_error(path);
  std::filesystem::remove(path);
}

TEST(Tokenizer, APreTokenizerWithoutByteLevelIsRefused) {
  // The tokenizers library would look raw characters up in the byte alphabet's
  // vocabulary; tide used to split bytes anyway, and saved such a file with GPT-2's
  // pre-tokenizer in its place (found by tests/fuzz: the saved file encoded otherwise).
  for (const nlohmann::json& pre :
       {nlohmann::json(), nlohmann::json{{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Removed"}}}) {
    const auto path = edited_tokenizer("tide_tok_nobytes", [&](nlohmann::json& j) { j["pre_tokenizer"] = pre; });
    EXPECT_NE(load_error(path).find("has no ByteLevel step; tide reads byte-level BPE tokenizer.json files only"),
              std::string::npos)
        << load_error(path);
    std::filesystem::remove(path);
  }
}

TEST(Tokenizer, NormalizerIsAppliedKeptOnSaveAndOthersAreRefusedByName) {
  // A byte tokenizer with NFC: a decomposed e-acute (65 CC 81) is encoded as the composed
  // one's two bytes (C3 A9). Bytes that are not UTF-8 pass through, so any input still
  // encodes and decodes.
  const auto path = edited_tokenizer("tide_tok_nfc", [](nlohmann::json& j) { j["normalizer"] = {{"type", "NFC"}}; });
  const auto nfc = load_tokenizer(path);
  EXPECT_EQ(nfc->decode(nfc->encode("caf"
                                    "e\xCC\x81")),
            "caf\xC3\xA9");
  EXPECT_EQ(nfc->encode("caf"
                        "e\xCC\x81"),
            nfc->encode("caf\xC3\xA9"));
  const std::string broken = "a\xFF\xC3 e\xCC\x81\x80";
  EXPECT_EQ(nfc->decode(nfc->encode(broken)), "a\xFF\xC3 \xC3\xA9\x80");
  nfc->save(path);
  std::ifstream in(path);
  EXPECT_EQ(nlohmann::json::parse(in)["normalizer"], (nlohmann::json{{"type", "NFC"}}));
  EXPECT_EQ(load_tokenizer(path)->encode("caf"
                                         "e\xCC\x81"),
            nfc->encode("caf\xC3\xA9"));
  std::filesystem::remove(path);
  // Unchanged without one: the decomposed form stays three bytes.
  EXPECT_EQ(ByteLevelBpe::bytes().encode("e\xCC\x81").size(), 3u);
  for (const nlohmann::json& norm :
       {nlohmann::json{{"type", "Lowercase"}},
        nlohmann::json{{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Strip"}}}}}}) {
    const auto bad = edited_tokenizer("tide_tok_norm", [&](nlohmann::json& j) { j["normalizer"] = norm; });
    const std::string e = load_error(bad);
    EXPECT_NE(e.find(bad + ": normalizer '" + (norm["type"] == "Sequence" ? "Strip" : "Lowercase") +
                     "' is not supported (NFC, NFD, NFKC, NFKD and Sequence are)"),
              std::string::npos)
        << e;
    std::filesystem::remove(bad);
  }
}

TEST(Tokenizer, ABacktrackingPatternIsStoppedAndNamed) {
  // "(a*)*b" on a run of a's without a b tries every way to split the run: 2^40 paths.
  const auto path = edited_tokenizer("tide_tok_regex", [](nlohmann::json& j) {
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Split"}, {"pattern", {{"Regex", "(a*)*b"}}}, {"behavior", "Isolated"}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
  });
  const auto t = load_tokenizer(path);
  try {
    t->encode(std::string(40, 'a'));
    FAIL() << "the pattern ran to its end";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find(path + ": pre-tokenizer pattern '(a*)*b' takes too long on a text of 40 bytes"),
        std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace tide

namespace tide {
namespace {

// Special tokens in a text: each occurrence its id, the longest where two start together,
// whatever the number of kinds (Llama 3 lists 256) or of occurrences.
TEST(SpecialTokens, EveryOccurrenceIsItsIdTheLongestFirst) {
  ByteLevelBpe t = ByteLevelBpe::bytes();
  std::vector<std::string> reserved;
  for (int i = 0; i < 256; ++i) reserved.push_back("<|reserved_" + std::to_string(i) + "|>");
  reserved.emplace_back("<ab>");
  reserved.emplace_back("<ab><c>");
  t.add_special_tokens(reserved);
  const int32_t first = 257;  // after the bytes and <|endoftext|>
  std::string text;
  std::vector<int32_t> want;
  for (int i = 0; i < 5000; ++i) {
    text += "x<|reserved_7|><|reserved_70|><ab><c><ab>";
    want.insert(want.end(), {'x', first + 7, first + 70, first + 257, first + 256});
  }
  EXPECT_EQ(t.encode(text), want);
}

}  // namespace
}  // namespace tide
