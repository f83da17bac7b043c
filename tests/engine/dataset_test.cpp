#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include "test_data.h"
#include "tide/engine/data/dataset_writer.h"
#include "tide/engine/data/token_dataset.h"
#include "tide/engine/data/tokenizer.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

// `split` holds exactly `ids`, and its loss mask is `mask`.
void expect_ids_and_mask(const TokenSplit& split, const std::vector<int32_t>& ids, const std::vector<uint8_t>& mask) {
  ASSERT_EQ(split.size(), static_cast<int64_t>(ids.size()));
  for (int64_t i = 0; i < split.size(); ++i) EXPECT_EQ(static_cast<int32_t>(split.at(i)), ids[i]) << "token " << i;
  std::vector<uint8_t> read(static_cast<size_t>(split.size()));
  split.copy_loss_mask(0, split.size(), read.data());
  EXPECT_EQ(read, mask);
}

class DatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("tide_dataset_test_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "in" / "sub");
    write(dir_ / "in" / "a.txt", "First document, first file.\n\nSecond document\nspans two lines.\n\n\n");
    write(dir_ / "in" / "sub" / "b.txt", "Third document here. Third document again.\n  \nFourth, the last one.");
  }
  void TearDown() override { fs::remove_all(dir_); }
  static void write(const fs::path& p, const std::string& s) { std::ofstream(p) << s; }
  // The two input files as a dataset of byte ids; returns its directory.
  fs::path prepare_bytes() const {
    PrepareOptions opt;
    opt.inputs = {(dir_ / "in").string()};
    opt.out_dir = (dir_ / "out").string();
    opt.tokenizer = "bytes";
    prepare_dataset(opt);
    return opt.out_dir;
  }
  // The prompt-completion examples of `jsonl` as a dataset of byte ids, every example in
  // the train split; returns its directory.
  fs::path prepare_examples(const fs::path& jsonl) const {
    return testing::prepare_prompt_completions(jsonl.string(), (dir_ / "out").string(), 0);
  }
  fs::path dir_;
};

TEST(SplitDocuments, BlankLinesSeparate) {
  const auto docs = split_documents("a b\n\n\n c\nd \n \t\nlast");
  ASSERT_EQ(docs.size(), 3u);
  EXPECT_EQ(docs[0], "a b");
  EXPECT_EQ(docs[1], "c\nd");
  EXPECT_EQ(docs[2], "last");
}

TEST_F(DatasetTest, ReadsBackExactlyTheTokensItWrote) {
  PrepareOptions opt;
  opt.inputs = {(dir_ / "in").string()};
  opt.out_dir = (dir_ / "out").string();
  opt.tokenizer = "bpe";
  opt.vocab_size = 300;
  opt.val_fraction = 0.25;  // every 4th document, spread: document 2 goes to validation
  const PrepareReport r = prepare_dataset(opt);
  EXPECT_EQ(r.documents, 4);

  const TokenDataset ds(opt.out_dir);
  const auto tok = load_tokenizer(ds.tokenizer_path());
  const std::vector<std::string> docs = {"First document, first file.", "Second document\nspans two lines.",
                                         "Third document here. Third document again.", "Fourth, the last one."};
  std::vector<int32_t> train, val;
  for (size_t i = 0; i < docs.size(); ++i) {
    auto ids = tok->encode(docs[i]);
    ids.push_back(tok->eos_id());
    auto& target = (i == 2) ? val : train;
    target.insert(target.end(), ids.begin(), ids.end());
  }
  auto read = [](const TokenSplit& s) {
    std::vector<int32_t> out;
    for (int64_t i = 0; i < s.size(); ++i) out.push_back(static_cast<int32_t>(s.at(i)));
    return out;
  };
  EXPECT_EQ(read(ds.split("train")), train);
  EXPECT_EQ(read(ds.split("val")), val);
  EXPECT_EQ(ds.split("train").documents(), 3);
  EXPECT_EQ(ds.split("val").documents(), 1);
  EXPECT_EQ(ds.meta()["dtype"], "uint16");
  EXPECT_EQ(ds.meta()["splits"]["train"]["tokens"].get<int64_t>(), static_cast<int64_t>(train.size()));
  // Raw bytes on disk are little-endian uint16 ids, as docs/data.md says.
  std::ifstream bin(fs::path(opt.out_dir) / "train.bin", std::ios::binary);
  uint16_t first = 0;
  bin.read(reinterpret_cast<char*>(&first), 2);
  EXPECT_EQ(first, static_cast<uint16_t>(train[0]));
}

TEST_F(DatasetTest, CorruptIndexIsReportedByName) {
  PrepareOptions opt;
  opt.inputs = {(dir_ / "in").string()};
  opt.out_dir = (dir_ / "out").string();
  opt.tokenizer = "bytes";
  prepare_dataset(opt);
  {
    std::fstream idx(fs::path(opt.out_dir) / "val.idx", std::ios::in | std::ios::out | std::ios::binary);
    idx.write("XXXX", 4);
  }
  try {
    TokenDataset ds(opt.out_dir);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("val.idx"), std::string::npos) << e.what();
  }
}

// Rewrites dataset.json through `edit`.
void edit_meta(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json meta;
  std::ifstream(dir / "dataset.json") >> meta;
  edit(meta);
  std::ofstream(dir / "dataset.json", std::ios::trunc) << meta.dump();
}

std::string open_error(const fs::path& dir) {
  try {
    TokenDataset ds(dir.string());
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "";
}

TEST_F(DatasetTest, AnIdOutsideTheVocabularyFailsAtOpenNamingFileAndOffset) {
  const fs::path out = prepare_bytes();  // 257 ids
  // Token 5 of train.bin becomes 257, one past the vocabulary; the recorded hash is
  // updated too, so only the id check can catch it.
  {
    std::fstream bin(out / "train.bin", std::ios::in | std::ios::out | std::ios::binary);
    bin.seekp(2 * 5);
    const uint16_t bad = 257;
    bin.write(reinterpret_cast<const char*>(&bad), 2);
  }
  edit_meta(out, [](nlohmann::json& m) { m["splits"]["train"].erase("xxh3"); });
  const std::string e = open_error(out);
  EXPECT_NE(e.find("train.bin: token id 257 at token offset 5 (byte 10)"), std::string::npos) << e;
  EXPECT_NE(e.find("vocabulary size 257"), std::string::npos) << e;
}

TEST_F(DatasetTest, AChangedSplitFailsItsRecordedHash) {
  const fs::path out = prepare_bytes();
  EXPECT_EQ(open_error(out), "");
  {
    std::fstream bin(out / "val.bin", std::ios::in | std::ios::out | std::ios::binary);
    const uint16_t other = 'Q';
    bin.write(reinterpret_cast<const char*>(&other), 2);  // still a valid id
  }
  const std::string e = open_error(out);
  EXPECT_NE(e.find("val.bin: contents hash to xxh3"), std::string::npos) << e;
  EXPECT_NE(e.find("prepare the dataset again"), std::string::npos) << e;
}

// Prompt-completion examples (`--format prompt-completion`): each a document of the
// prompt's ids, the completion's and the end-of-text; the loss mask is 0 for the prompt's
// tokens and 1 for the rest, one byte a token, hashed into dataset.json.
TEST_F(DatasetTest, PromptCompletionExamplesCountTheirCompletionsOnly) {
  write(dir_ / "examples.jsonl",
        "{\"prompt\": \"Q: two and two?\\n\", \"completion\": \"A: four\", \"id\": 7}\n"
        "\n"
        "{\"completion\": \"no prompt at all\", \"prompt\": \"\"}\n"
        "  \t\n"
        "{\"prompt\": \"caf\\u00e9?\", \"completion\": \"oui\"}\n");
  const fs::path out = prepare_examples(dir_ / "examples.jsonl");
  const TokenDataset ds(out.string());
  ASSERT_TRUE(ds.has_loss_mask());
  EXPECT_EQ(ds.meta()["loss_mask"], true);
  EXPECT_EQ(ds.meta()["document_separator"], "json lines");
  const auto tok = load_tokenizer(ds.tokenizer_path());
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  for (const auto& [prompt, completion] : std::vector<std::pair<std::string, std::string>>{
           {"Q: two and two?\n", "A: four"}, {"", "no prompt at all"}, {"caf\xc3\xa9?", "oui"}}) {
    const auto p = tok->encode(prompt), c = tok->encode(completion);
    ids.insert(ids.end(), p.begin(), p.end());
    ids.insert(ids.end(), c.begin(), c.end());
    ids.push_back(tok->eos_id());
    mask.insert(mask.end(), p.size(), 0);
    mask.insert(mask.end(), c.size() + 1, 1);
  }
  const TokenSplit& train = ds.split("train");
  expect_ids_and_mask(train, ids, mask);
  // On disk: one byte a token.
  EXPECT_EQ(fs::file_size(out / "train.mask"), ids.size());
  EXPECT_EQ(train.documents(), 3);
  EXPECT_EQ(ds.meta()["splits"]["train"]["mask_xxh3"].get<std::string>().size(), 16u);
  // Where each document starts, and how many start by a position.
  EXPECT_EQ(train.document_start(1), 16 + 7 + 1);
  EXPECT_EQ(train.documents_starting_by(0), 1);
  EXPECT_EQ(train.documents_starting_by(train.document_start(1)), 2);
  EXPECT_EQ(train.documents_starting_by(train.size()), 3);
}

// A line that is not an example names the file and the line, and nothing is written.
TEST_F(DatasetTest, APromptCompletionLineThatIsNotAnExampleIsNamed) {
  const auto error = [&](const std::string& second_line) {
    write(dir_ / "bad.jsonl", "{\"prompt\": \"a\", \"completion\": \"b\"}\n" + second_line + "\n");
    try {
      prepare_examples(dir_ / "bad.jsonl");
    } catch (const std::exception& e) {
      EXPECT_FALSE(fs::exists(dir_ / "out")) << second_line;
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string where = (dir_ / "bad.jsonl").string() + ":2";
  EXPECT_NE(error("{\"prompt\": \"a\"").find(where), std::string::npos);  // not JSON
  EXPECT_NE(error("{\"prompt\": \"a\"}").find(where + ": no \"completion\""), std::string::npos);
  EXPECT_NE(error("{\"prompt\": 3, \"completion\": \"b\"}").find(where + ": \"prompt\" is number, not a string"),
            std::string::npos);
  EXPECT_NE(error("[1, 2]").find(where + ": [1,2] is not an object"), std::string::npos);
  EXPECT_NE(error("{\"prompt\": \"a\", \"completion\": \"\"}").find(where + ": an empty \"completion\""),
            std::string::npos);
  EXPECT_NE(error(std::string(100, '[') + std::string(100, ']')).find(where), std::string::npos);  // too deep
  PrepareOptions opt;
  opt.format = "chat";
  EXPECT_THROW(prepare_dataset(opt), std::invalid_argument);
}

// Conversations (`--format messages`): each a document as its chat template writes it,
// the assistant's turns (and the end-of-text) counted; a byte tokenizer gets the
// template's special tokens, and a tokenizer file that has them chooses the template.
TEST_F(DatasetTest, ConversationsCountTheAssistantsTurnsOnly) {
  write(
      dir_ / "chat.jsonl",
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}, )"
      R"({"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}]})"
      "\n\n"
      R"({"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]})"
      "\n");
  PrepareOptions opt;
  opt.inputs = {(dir_ / "chat.jsonl").string()};
  opt.out_dir = (dir_ / "out").string();
  opt.tokenizer = "bytes";
  opt.val_fraction = 0;
  opt.format = "messages";
  opt.chat_template = "chatml";
  prepare_dataset(opt);
  const TokenDataset ds(opt.out_dir);
  ASSERT_TRUE(ds.has_loss_mask());
  EXPECT_EQ(ds.meta()["chat_template"], "chatml");
  EXPECT_EQ(ds.meta()["vocab_size"], 256 + 3);
  const auto tok = load_tokenizer(ds.tokenizer_path());
  // Byte ids split nothing across spans: each span's ids, its flag on each.
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  auto add = [&](const std::string& text, bool counted) {
    const auto span = tok->encode(text);
    ids.insert(ids.end(), span.begin(), span.end());
    mask.insert(mask.end(), span.size(), counted ? 1 : 0);
  };
  add("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n", false);
  add("4<|im_end|>", true);
  add("\n<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n", false);
  add("6<|im_end|>", true);
  add("\n", false);
  add("<|endoftext|>", true);
  add("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", false);
  add("hello<|im_end|>", true);
  add("\n", false);
  add("<|endoftext|>", true);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 257), 7);  // <|im_start|>: one id a message
  const TokenSplit& train = ds.split("train");
  expect_ids_and_mask(train, ids, mask);
  EXPECT_EQ(train.documents(), 2);

  // The prepared tokenizer.json has ChatML's tokens: named no template, it is chosen.
  const std::string tokenizer_file = (dir_ / "chatml-tokenizer.json").string();
  fs::copy_file(ds.tokenizer_path(), tokenizer_file);
  opt.tokenizer = tokenizer_file;
  opt.chat_template.clear();
  opt.out_dir = (dir_ / "again").string();
  prepare_dataset(opt);
  const TokenDataset again(opt.out_dir);
  EXPECT_EQ(again.meta()["chat_template"], "chatml");
  EXPECT_EQ(again.meta()["splits"]["train"]["mask_xxh3"], ds.meta()["splits"]["train"]["mask_xxh3"]);
  EXPECT_EQ(again.meta()["splits"]["train"]["xxh3"], ds.meta()["splits"]["train"]["xxh3"]);
}

// A conversation its template cannot write, a template the tokenizer has no tokens for,
// or one named where none can be chosen, is refused before anything is written.
TEST_F(DatasetTest, AConversationOrTemplateThatCannotBeWrittenIsRefused) {
  write(
      dir_ / "chat.jsonl",
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]})"
      "\n"
      R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}]})"
      "\n");
  auto error = [&](const std::string& tokenizer, const std::string& chat_template, const std::string& format) {
    PrepareOptions opt;
    opt.inputs = {(dir_ / "chat.jsonl").string()};
    opt.out_dir = (dir_ / "out").string();
    opt.tokenizer = tokenizer;
    opt.format = format;
    opt.chat_template = chat_template;
    try {
      prepare_dataset(opt);
    } catch (const std::exception& e) {
      EXPECT_FALSE(fs::exists(dir_ / "out")) << e.what();
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(
      error("bytes", "gemma", "messages"),
      (dir_ / "chat.jsonl").string() +
          ":2: message 1 is user's turn: the gemma template's turns alternate user, assistant, starting with user");
  EXPECT_EQ(error("bpe", "", "messages"),
            "--format messages with tokenizer 'bpe' needs a chat template named (llama3, chatml, gemma): its "
            "vocabulary is made here");
  EXPECT_EQ(error("bytes", "chatml", "text"), "chat template 'chatml' is for --format messages, not text");
  // A tokenizer file without the template's tokens, named one or not.
  const std::string plain = (dir_ / "plain.json").string();
  ByteLevelBpe::bytes().save(plain);
  EXPECT_EQ(error(plain, "llama3", "messages"),
            "tokenizer '" + plain +
                "' has no special token <|begin_of_text|> for the llama3 chat template (it would be split into "
                "pieces of text)");
  EXPECT_EQ(error(plain, "", "messages"),
            "tokenizer '" + plain +
                "' has the special tokens of no chat template tide knows (llama3, chatml, gemma): name one with "
                "--chat-template");
  // Nothing of a failed prepare is left beside the dataset it would have written.
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename().string().find("out.tmp-"), std::string::npos) << e.path();
}

// A loss mask that does not fit its split, holds a byte other than 0 or 1, or changed
// after prepare is refused at open, naming the file.
TEST_F(DatasetTest, ALossMaskIsCheckedAtOpen) {
  write(dir_ / "examples.jsonl",
        "{\"prompt\": \"to \", \"completion\": \"be\"}\n{\"prompt\": \"or \", \"completion\": \"not\"}\n");
  const fs::path out = prepare_examples(dir_ / "examples.jsonl");
  EXPECT_EQ(open_error(out), "");
  {
    std::fstream mask(out / "train.mask", std::ios::in | std::ios::out | std::ios::binary);
    mask.seekp(4);
    mask.put('\0');  // the completion's first byte, still 0 or 1
  }
  std::string e = open_error(out);
  EXPECT_NE(e.find("train.mask: contents hash to xxh3"), std::string::npos) << e;
  {
    std::fstream mask(out / "train.mask", std::ios::in | std::ios::out | std::ios::binary);
    mask.seekp(2);
    mask.put('\2');
  }
  e = open_error(out);
  EXPECT_NE(e.find("train.mask: byte 2 at token offset 2 is neither 0"), std::string::npos) << e;
  fs::resize_file(out / "train.mask", 3);
  e = open_error(out);
  EXPECT_NE(e.find("train.mask: size 3 is not one byte for each of the"), std::string::npos) << e;
  edit_meta(out, [](nlohmann::json& m) { m["loss_mask"] = "yes"; });
  e = open_error(out);
  EXPECT_NE(e.find("loss_mask \"yes\" is not true or false"), std::string::npos) << e;
}

TEST_F(DatasetTest, MetadataOfTheWrongTypeIsNamed) {
  const fs::path out = prepare_bytes();
  edit_meta(out, [](nlohmann::json& m) { m["vocab_size"] = "257"; });
  EXPECT_NE(open_error(out).find("vocab_size \"257\" is not an integer"), std::string::npos) << open_error(out);
  edit_meta(out, [](nlohmann::json& m) {
    m["vocab_size"] = 257;
    m["splits"]["train"]["tokens"] = 3;
  });
  EXPECT_NE(open_error(out).find("splits.train.tokens 3 differs"), std::string::npos) << open_error(out);
}

TEST_F(DatasetTest, AnIndexWhoseDocumentCountWrapsTheSizeCheckIsRefused) {
  // 24 + 8 * (2^61 - 1 + 1) wraps to 24 in 64 bits: a header-only index that claimed
  // 2^61 - 1 documents passed the size check and asked for 2^64 bytes (found by
  // tests/fuzz).
  const fs::path out = prepare_bytes();
  std::string header(kIndexMagic, 8);
  const uint64_t version = kIndexVersion, documents = (uint64_t{1} << 61) - 1;
  header.append(reinterpret_cast<const char*>(&version), 8).append(reinterpret_cast<const char*>(&documents), 8);
  std::ofstream(out / "val.idx", std::ios::binary | std::ios::trunc) << header;
  const std::string e = open_error(out);
  EXPECT_NE(e.find("val.idx: size 24 does not match 2305843009213693951 documents"), std::string::npos) << e;
}

TEST_F(DatasetTest, DocumentOffsetsMustRise) {
  const fs::path out = prepare_bytes();
  {
    std::fstream idx(out / "train.idx", std::ios::in | std::ios::out | std::ios::binary);
    idx.seekp(24 + 8);
    const uint64_t past_the_end = uint64_t{1} << 40;  // document 0 ends beyond everything
    idx.write(reinterpret_cast<const char*>(&past_the_end), 8);
  }
  const std::string e = open_error(out);
  EXPECT_NE(e.find("train.idx: document 1 ends at offset"), std::string::npos) << e;
}

TEST_F(DatasetTest, ATokenizerNameMustStayInTheDatasetDirectory) {
  const fs::path out = prepare_bytes();
  edit_meta(out, [](nlohmann::json& m) { m["tokenizer"] = "../../etc/passwd"; });
  const std::string e = open_error(out);
  EXPECT_NE(e.find("dataset.json: tokenizer \"../../etc/passwd\" is not a file name inside the dataset directory"),
            std::string::npos)
      << e;
}

TEST_F(DatasetTest, MissingDatasetSaysWhatToRun) {
  try {
    TokenDataset ds((dir_ / "nothing").string());
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("tide data prepare"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tide
