// Our SentencePiece BPE reader against the real thing: Debian's spm_train builds a
// model, spm_encode gives the reference ids.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tide/engine/data/tokenizer.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  ::pclose(p);
  return out;
}

class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("tide_spm_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string corpus = "/usr/share/common-licenses/GPL-3";
    for (const auto& [name, extra] : {std::pair<std::string, std::string>{"llama", "--add_dummy_prefix=true "
                                                                                     "--remove_extra_whitespaces=false"},
                                      {"collapse", "--byte_fallback=false"}}) {
      const std::string cmd = "spm_train --input=" + corpus + " --model_prefix=" + (dir_ / name).string() +
                              " --model_type=bpe --vocab_size=600 --normalization_rule_name=identity "
                              "--character_coverage=1.0 --byte_fallback=true --minloglevel=2 " +
                              extra + " > /dev/null 2>&1";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << "spm_train (Debian package sentencepiece) failed: " << cmd;
    }
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::vector<int32_t> reference(const std::string& model, const std::string& line) {
    const fs::path in = dir_ / "line.txt";
    std::ofstream(in) << line << "\n";
    std::istringstream ids(run("spm_encode --model=" + (dir_ / (model + ".model")).string() +
                               " --output_format=id < " + in.string()));
    std::vector<int32_t> out;
    int32_t id;
    while (ids >> id) out.push_back(id);
    return out;
  }
  static fs::path dir_;
};
fs::path SentencePieceTest::dir_;

const char* const kLines[] = {
    "This program is free software: you can redistribute it and/or modify",
    "  two leading spaces,   runs   of spaces and trailing  ",
    "Ünïcödé, emoji \xF0\x9F\x98\x80 and CJK \xE4\xB8\xAD\xE6\x96\x87 fall back to bytes",
    "GNU General Public License version 3 (GPLv3) -- 2007!",
    "x",
};

TEST_F(SentencePieceTest, IdsEqualSpmEncodeWithByteFallback) {
  const auto t = SentencePieceBpe::load((dir_ / "llama.model").string());
  EXPECT_EQ(t.vocab_size(), 600);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.token_text(1), "<s>");
  EXPECT_EQ(t.token_text(2), "</s>");
  for (const char* line : kLines) EXPECT_EQ(t.encode(line), reference("llama", line)) << line;
}

TEST_F(SentencePieceTest, IdsEqualSpmEncodeWithWhitespaceCollapsing) {
  const auto t = SentencePieceBpe::load((dir_ / "collapse.model").string());
  for (const char* line : kLines) EXPECT_EQ(t.encode(line), reference("collapse", line)) << line;
}

TEST_F(SentencePieceTest, DecodeInvertsEncode) {
  const auto t = load_tokenizer((dir_ / "llama.model").string());
  for (const char* line : kLines) EXPECT_EQ(t->decode(t->encode(line)), line);
  EXPECT_EQ(t->file_name(), "tokenizer.model");
}

TEST_F(SentencePieceTest, CorruptModelIsNamed) {
  const fs::path bad = dir_ / "bad.model";
  std::ofstream(bad, std::ios::binary) << std::string("\x0a\xff\xff\xff\x0f garbage", 12);
  try {
    load_tokenizer(bad.string());
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.model"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tide
