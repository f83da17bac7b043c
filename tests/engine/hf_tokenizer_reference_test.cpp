// Byte-level BPE tokenizer.json files with GPT-2's, LLaMA-3's, BLOOM's and Qwen2's
// pre-tokenizers and Unicode normalizers: our ids and decoded text against Hugging
// Face's tokenizers library (the Rust one, from PyPI, in the project's .venv;
// tests/engine/hf_encode.py).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include "command_output.h"
#include "tide/engine/data/tokenizer.h"

namespace tide {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// BLOOM's pattern has a nested class: '(', ')' and '|' are delimiters in the Rust
// library (Oniguruma) and in ICU alike (a line below has all three).
const char* const kBloomPattern = " ?[^(\\s|[.,!?\xE2\x80\xA6\xE3\x80\x82\xEF\xBC\x8C\xE3\x80\x81\xE0\xA5\xA4\xDB\x94\xD8\x8C])]+";

const std::vector<std::string> kReferenceLines = {
    "This program is free software: you can redistribute it and/or modify it.",
    "DON'T we'll THEY'RE it's I'M 12345 678 9, 3.14159 and 1000000 numbers",
    "  leading spaces,\ttabs,\n\nnew lines\r\n and trailing   ",
    "na\xC3\xAFve caf\xC3\xA9 \xE2\x80\x9Cquoted\xE2\x80\x9D \xE2\x80\x94 em dash\xE2\x80\xA6 end.",
    "\xE4\xB8\xAD\xE6\x96\x87\xE3\x80\x82\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xEF\xBC\x8C \xF0\x9F\x98\x80 emoji",
    "special <|endoftext|> tokens<|endoftext|>inside",
    "(parentheses) | pipes|(nested (ones)) a|b",
    // Decomposed e and A with their combining accents, an Angstrom sign (NFC makes it
    // A-ring), a ligature, a circled digit, fullwidth letters and decomposed Hangul: the
    // normal forms each change some of them.
    "cafe\xCC\x81 re\xCC\x81sume\xCC\x81 A\xCC\x8A \xE2\x84\xAB 2024",
    "\xEF\xAC\x81ne \xE2\x91\xA0 \xEF\xBD\x86\xEF\xBD\x95\xEF\xBD\x8C\xEF\xBD\x8C \xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB",
    // A special token with a combining mark after it: the mark is normalised alone, as
    // the token is taken out of the raw text first.
    "end<|endoftext|>\xCC\xB8 e\xCC\x81",
    "",
};

class HfTokenizerReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("tide_hf_tok_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ifstream in("/usr/share/common-licenses/GPL-3");
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string corpus =
        ss.str() + "\n12345 67890 DON'T caf\xC3\xA9 na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 fine full\n";
    train_bpe({corpus}, 700).save((dir_ / "gpt2.json").string());
    // The same corpus through the tokenizers library itself: its files put the special
    // tokens first and the byte alphabet in its own order, so no byte is its own id.
    std::ofstream(dir_ / "corpus.txt") << corpus;
    for (const char* layout : {"gpt2", "llama3", "qwen2"}) {
      const std::string cmd = std::string(TIDE_PYTHON) + " " + TIDE_SOURCE_DIR + "/tests/engine/hf_train_bpe.py " +
                              layout + " " + (dir_ / "corpus.txt").string() + " 700 " +
                              (dir_ / (std::string("hf-") + layout + ".json")).string();
      if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << "the tokenizers library did not train: " << cmd;
    }
    std::ifstream base_in(dir_ / "gpt2.json");
    const json base = json::parse(base_in);
    auto variant = [&](const std::string& name, const std::string& pattern, bool ignore_merges,
                       const json& normalizer = nullptr) {
      json j = base;
      j["normalizer"] = normalizer;
      j["pre_tokenizer"] = {{"type", "Sequence"},
                            {"pretokenizers",
                             {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
                              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
      j["model"]["ignore_merges"] = ignore_merges;
      std::ofstream(dir_ / (name + ".json")) << j.dump();
    };
    variant("llama3", kLlama3Pattern, true);
    variant("bloom", kBloomPattern, false);
    // NFKD then NFC is NFKC, reached through a Sequence.
    variant("nfkc-sequence", kLlama3Pattern, false,
            {{"type", "Sequence"}, {"normalizers", {{{"type", "NFKD"}}, {{"type", "NFC"}}}}});
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  struct Reference {
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::string> decoded;
  };
  static Reference reference(const std::string& name) {
    const fs::path lines = dir_ / "lines.json";
    std::ofstream(lines) << json(kReferenceLines).dump();
    const std::string cmd = std::string(TIDE_PYTHON) + " " + TIDE_SOURCE_DIR + "/tests/engine/hf_encode.py " +
                            (dir_ / (name + ".json")).string() + " < " + lines.string() + " 2>&1";
    const std::string out = testing::command_output(cmd);
    const json j = json::parse(out, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ADD_FAILURE() << "the tokenizers reference did not run (scripts/setup.sh installs it into .venv): " << out;
      return {};
    }
    return {j.at("ids").get<std::vector<std::vector<int32_t>>>(), j.at("decoded").get<std::vector<std::string>>()};
  }

  void check(const std::string& name) {
    const auto ours = load_tokenizer((dir_ / (name + ".json")).string());
    const auto ref = reference(name);
    ASSERT_EQ(ref.ids.size(), kReferenceLines.size());
    ASSERT_EQ(ref.decoded.size(), kReferenceLines.size());
    for (size_t i = 0; i < kReferenceLines.size(); ++i) {
      EXPECT_EQ(ours->encode(kReferenceLines[i]), ref.ids[i]) << name << ": " << kReferenceLines[i];
      EXPECT_EQ(ours->decode(ours->encode(kReferenceLines[i])), ref.decoded[i]) << name << ": " << kReferenceLines[i];
    }
  }
  static fs::path dir_;
};
fs::path HfTokenizerReference::dir_;

TEST_F(HfTokenizerReference, Gpt2ByteLevel) { check("gpt2"); }
TEST_F(HfTokenizerReference, Llama3SplitWithIgnoreMerges) { check("llama3"); }
TEST_F(HfTokenizerReference, BloomSplit) { check("bloom"); }
TEST_F(HfTokenizerReference, Gpt2LayoutTrainedByTheTokenizersLibrary) { check("hf-gpt2"); }
TEST_F(HfTokenizerReference, Llama3LayoutTrainedByTheTokenizersLibrary) { check("hf-llama3"); }
TEST_F(HfTokenizerReference, Qwen2LayoutWithNfcTrainedByTheTokenizersLibrary) { check("hf-qwen2"); }
TEST_F(HfTokenizerReference, NormalizerSequence) { check("nfkc-sequence"); }

TEST(HfTokenizer, UnsupportedPreTokenizerIsNamed) {
  const auto path = fs::temp_directory_path() / ("tide_tok_meta_" + std::to_string(::getpid()) + ".json");
  ByteLevelBpe::bytes().save(path.string());
  std::ifstream in(path);
  json j = json::parse(in);
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  std::ofstream(path, std::ios::trunc) << j.dump();
  try {
    load_tokenizer(path.string());
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'Metaspace'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path.string()), std::string::npos) << e.what();
  }
  fs::remove(path);
}

}  // namespace
}  // namespace tide
