// Our SentencePiece BPE reader against the real thing: Debian's spm_train builds a
// model, spm_encode gives the reference ids.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "command_output.h"
#include "tide/engine/data/chat_template.h"
#include "tide/engine/data/dataset_writer.h"
#include "tide/engine/data/token_dataset.h"
#include "tide/engine/data/tokenizer.h"
#include "tide/engine/model/model_weights.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

using testing::command_output;

class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("tide_spm_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    const std::string corpus = "/usr/share/common-licenses/GPL-3";
    for (const auto& [name, extra] : {std::pair<std::string, std::string>{"llama",
                                                                          "--add_dummy_prefix=true "
                                                                          "--remove_extra_whitespaces=false"},
                                      {"collapse", "--byte_fallback=false"},
                                      // Gemma's layout: no dummy prefix, spaces kept, its turn
                                      // markers user-defined, <bos> and <eos> control pieces.
                                      {"gemma",
                                       "--add_dummy_prefix=false --remove_extra_whitespaces=false "
                                       "'--user_defined_symbols=<start_of_turn>,<end_of_turn>,<turn>' "
                                       "'--bos_piece=<bos>' '--eos_piece=<eos>'"}}) {
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
    std::istringstream ids(command_output("spm_encode --model=" + (dir_ / (model + ".model")).string() +
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

// A Hugging Face directory of Llama 2, Mistral or Gemma holds the SentencePiece model and
// its conversion to tokenizer.json (BPE with byte fallback, which tide does not read):
// the tokenizer found beside the weights is the model, which encodes as spm_encode does;
// the conversion given by hand is refused naming the model to give instead.
TEST_F(SentencePieceTest, BesideItsTokenizerJsonConversionTheModelIsTheOneRead) {
  const fs::path repo = dir_ / "hf-repo";
  fs::create_directories(repo);
  fs::copy_file(dir_ / "llama.model", repo / "tokenizer.model", fs::copy_options::overwrite_existing);
  const nlohmann::json converted = {
      {"normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}, {"prepend", "\u2581"}}}}}},
      {"model",
       {{"type", "BPE"}, {"byte_fallback", true}, {"fuse_unk", true}, {"vocab", {{"<unk>", 0}}}, {"merges", {}}}}};
  std::ofstream(repo / "tokenizer.json") << converted.dump();
  EXPECT_EQ(tokenizer_beside(repo), (repo / "tokenizer.model").string());
  const auto t = load_tokenizer(tokenizer_beside(repo));
  EXPECT_EQ(t->encode(kLines[0]), reference("llama", kLines[0]));
  try {
    load_tokenizer((repo / "tokenizer.json").string());
    ADD_FAILURE() << "a converted SentencePiece model was read as byte-level BPE";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("model.byte_fallback is true: a SentencePiece model converted"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("give that file instead"), std::string::npos) << e.what();
  }
  // Alone, a byte-level tokenizer.json is the one beside the weights.
  fs::remove(repo / "tokenizer.model");
  EXPECT_EQ(tokenizer_beside(repo), (repo / "tokenizer.json").string());
}

TEST_F(SentencePieceTest, IdsEqualSpmEncodeWithWhitespaceCollapsing) {
  const auto t = SentencePieceBpe::load((dir_ / "collapse.model").string());
  for (const char* line : kLines) EXPECT_EQ(t.encode(line), reference("collapse", line)) << line;
}

// User-defined pieces are matched whole, the longest first, and never merged with their
// neighbours; spm_encode says so.
TEST_F(SentencePieceTest, UserDefinedPiecesAreWholeAsSpmEncodeHasThem) {
  const auto t = SentencePieceBpe::load((dir_ / "gemma.model").string());
  const std::vector<std::string> lines = {
      // One line each: spm_encode reads lines.
      "<start_of_turn>user What is free software?<end_of_turn> <start_of_turn>model Software you may share.",
      "the<turn>of<start_of_turn><end_of_turn>the<start_of_turn",  // adjacent, and one cut short
      "  two leading spaces kept, no dummy prefix",
  };
  for (const auto& line : lines) EXPECT_EQ(t.encode(line), reference("gemma", line)) << line;
  const auto marker = t.encode("<start_of_turn>");
  ASSERT_EQ(marker.size(), 1u);
  EXPECT_EQ(t.token_text(marker[0]), "<start_of_turn>");
  EXPECT_EQ(chat_template_of(t), ChatTemplate::kGemma);

  // Such a tokenizer.model prepares conversations in Gemma's template, chosen by its tokens;
  // the counted ids are what the assistant says and its end of turn.
  std::ofstream(dir_ / "chat.jsonl") << R"({"messages": [{"role": "user", "content": "What is free software?"}, )"
                                     << R"({"role": "assistant", "content": "Software you may share."}]})"
                                     << "\n";
  PrepareOptions opt;
  opt.inputs = {(dir_ / "chat.jsonl").string()};
  opt.out_dir = (dir_ / "chat").string();
  opt.tokenizer = (dir_ / "gemma.model").string();
  opt.format = "messages";
  opt.val_fraction = 0;
  prepare_dataset(opt);
  const TokenDataset ds(opt.out_dir);
  EXPECT_EQ(ds.meta()["chat_template"], "gemma");
  const TokenSplit& train = ds.split("train");
  std::vector<uint8_t> mask(static_cast<size_t>(train.size()));
  train.copy_loss_mask(0, train.size(), mask.data());
  std::vector<int32_t> ids, counted;
  for (int64_t i = 0; i < train.size(); ++i) {
    ids.push_back(static_cast<int32_t>(train.at(i)));
    if (mask[static_cast<size_t>(i)] && ids.back() != t.eos_id()) counted.push_back(ids.back());
  }
  auto want = t.encode(
      "<bos><start_of_turn>user\nWhat is free software?<end_of_turn>\n<start_of_turn>model\nSoftware you may "
      "share.<end_of_turn>\n");
  want.push_back(t.eos_id());
  EXPECT_EQ(ids, want);
  EXPECT_EQ(t.decode(counted), "Software you may share.<end_of_turn>");
}

// Control pieces written in the text encode to their ids (as transformers' tokenizers take
// special tokens out first); the text around them encodes as it does alone, the dummy
// prefix only before the first.
TEST_F(SentencePieceTest, ControlPiecesInTheTextAreTheirIds) {
  const auto gemma = SentencePieceBpe::load((dir_ / "gemma.model").string());
  ASSERT_EQ(gemma.token_text(gemma.bos_id()), "<bos>");
  std::vector<int32_t> want = {gemma.bos_id()};
  for (const int32_t id : gemma.encode("Hello")) want.push_back(id);
  want.push_back(gemma.eos_id());
  EXPECT_EQ(gemma.encode("<bos>Hello<eos>"), want);
  const auto llama = SentencePieceBpe::load((dir_ / "llama.model").string());
  want = llama.encode("free software");  // with its dummy prefix
  want.push_back(llama.eos_id());
  want.push_back(llama.bos_id());
  EXPECT_EQ(llama.encode("free software</s><s>"), want);
  const auto ids = llama.encode("</s>free");
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], llama.eos_id());
  std::string pieces;
  for (size_t i = 1; i < ids.size(); ++i) pieces += llama.token_text(ids[i]);
  EXPECT_EQ(pieces, "free") << "no dummy prefix after a control piece";
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

// A SentencePiece model written field by field in protobuf's wire format: BPE, the
// identity normaliser, the given pieces (text, type) and unk_id.
std::string model_bytes(const std::vector<std::pair<std::string, int>>& pieces, int unk_id) {
  const auto varint = [](uint64_t v) {
    std::string out;
    for (; v >= 0x80; v >>= 7) out += static_cast<char>(0x80 | (v & 0x7F));
    return out + static_cast<char>(v);
  };
  const auto field = [&](int number, const std::string& bytes) {
    return varint(number << 3 | 2) + varint(bytes.size()) + bytes;
  };
  std::string out;
  for (const auto& [text, type] : pieces) out += field(1, field(1, text) + varint(3 << 3) + varint(type));
  out += field(2, varint(3 << 3) + varint(2) + varint(40 << 3) + varint(unk_id));  // model_type BPE, unk_id
  out += field(3, field(1, "identity"));
  return out;
}

TEST_F(SentencePieceTest, AMalformedBytePieceIsRefusedNotWrittenBeforeItsTable) {
  // "<0x-1>" parsed as byte -1 wrote before the byte table (found by tests/fuzz).
  const fs::path bad = dir_ / "byte.model";
  std::ofstream(bad, std::ios::binary) << model_bytes({{"<unk>", 2}, {"<0x-1>", 6}, {"a", 1}}, 0);
  try {
    load_tokenizer(bad.string());
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find("byte.model: not a SentencePiece model (byte piece 1 is '<0x-1>', not <0xHH>)"),
        std::string::npos)
        << e.what();
  }
  std::ofstream(bad, std::ios::binary | std::ios::trunc) << model_bytes({{"<unk>", 2}, {"<0x0A>", 6}, {"a", 1}}, 0);
  EXPECT_EQ(load_tokenizer(bad.string())->encode("a"), (std::vector<int32_t>{0, 2}));  // "▁" is unknown
}

TEST_F(SentencePieceTest, AnUnknownIdOutsideThePiecesIsRefused) {
  // Every character the pieces lack would have encoded to id 7 of a 2-piece model.
  const fs::path bad = dir_ / "unk.model";
  std::ofstream(bad, std::ios::binary) << model_bytes({{"<unk>", 2}, {"a", 1}}, 7);
  try {
    load_tokenizer(bad.string());
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("unk.model: not a SentencePiece model (unk_id 7 is not one of the 2 pieces)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tide
