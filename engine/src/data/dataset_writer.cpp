#include "tide/engine/data/dataset_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>
#define XXH_STATIC_LINKING_ONLY  // XXH3_state_t on the stack
#include <xxhash.h>

#include "tide/engine/data/chat_template.h"
#include "tide/engine/data/fine_tuning_examples.h"
#include "tide/engine/data/text_spans.h"
#include "tide/engine/data/token_dataset.h"
#include "tide/engine/data/tokenizer.h"

namespace tide {
namespace fs = std::filesystem;

std::vector<std::string_view> split_documents(std::string_view text) {
  std::vector<std::string_view> docs;
  auto push = [&](size_t b, size_t e) {
    while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
    while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
    if (e > b) docs.push_back(text.substr(b, e - b));
  };
  size_t start = 0, i = 0;
  while (i < text.size()) {
    if (text[i] == '\n') {
      // A line holding only spaces and tabs ends the document.
      size_t j = i + 1;
      while (j < text.size() && (text[j] == ' ' || text[j] == '\t' || text[j] == '\r')) ++j;
      if (j < text.size() && text[j] == '\n') {
        push(start, i);
        while (j < text.size() && std::isspace(static_cast<unsigned char>(text[j]))) ++j;
        start = i = j;
        continue;
      }
    }
    ++i;
  }
  push(start, text.size());
  return docs;
}

namespace {

std::vector<std::string> list_inputs(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    if (fs::is_directory(in)) {
      std::vector<std::string> found;
      for (const auto& e : fs::recursive_directory_iterator(in))
        if (e.is_regular_file()) found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in)) {
      files.push_back(in);
    } else {
      throw std::runtime_error("input '" + in + "' is neither a file nor a folder");
    }
  }
  if (files.empty()) throw std::runtime_error("no input files found");
  return files;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path + "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Streams one split's tokens to <name>.bin, its document offsets to <name>.idx and, with
// `loss_mask`, whether each token counts as a target to <name>.mask.
class SplitWriter {
 public:
  SplitWriter(const fs::path& dir, const std::string& name, int dtype_bytes, bool loss_mask)
      : bin_path_(dir / (name + ".bin")),
        idx_path_(dir / (name + ".idx")),
        mask_path_(dir / (name + ".mask")),
        bytes_(dtype_bytes),
        loss_mask_(loss_mask) {
    out_.open(bin_path_, std::ios::binary | std::ios::trunc);
    if (!out_) throw std::runtime_error("cannot write '" + bin_path_.string() + "'");
    if (loss_mask_) {
      mask_out_.open(mask_path_, std::ios::binary | std::ios::trunc);
      if (!mask_out_) throw std::runtime_error("cannot write '" + mask_path_.string() + "'");
    }
    XXH3_64bits_reset(&hash_);
    XXH3_64bits_reset(&mask_hash_);
    offsets_.push_back(0);
  }
  // The document's ids and the end-of-text after them; its ids count as targets where
  // doc.counted says, the end-of-text always.
  void add_document(const CountedIds& doc, int32_t eos) {
    buf_.clear();
    for (const int32_t id : doc.ids) put(id);
    put(eos);
    out_.write(buf_.data(), static_cast<std::streamsize>(buf_.size()));
    XXH3_64bits_update(&hash_, buf_.data(), buf_.size());
    if (loss_mask_) {
      std::string mask(doc.counted.begin(), doc.counted.end());
      mask.push_back('\1');
      mask_out_.write(mask.data(), static_cast<std::streamsize>(mask.size()));
      XXH3_64bits_update(&mask_hash_, mask.data(), mask.size());
    }
    tokens_ += static_cast<int64_t>(doc.ids.size()) + 1;
    offsets_.push_back(static_cast<uint64_t>(tokens_));
  }
  nlohmann::json finish() {
    out_.close();
    if (!out_) throw std::runtime_error("cannot write '" + bin_path_.string() + "'");
    nlohmann::json split;
    if (loss_mask_) {
      mask_out_.close();
      if (!mask_out_) throw std::runtime_error("cannot write '" + mask_path_.string() + "'");
      split["mask_xxh3"] = xxh3_text(XXH3_64bits_digest(&mask_hash_));
    }
    std::ofstream idx(idx_path_, std::ios::binary | std::ios::trunc);
    const uint64_t n_docs = offsets_.size() - 1;
    idx.write(kIndexMagic, 8);
    idx.write(reinterpret_cast<const char*>(&kIndexVersion), 8);
    idx.write(reinterpret_cast<const char*>(&n_docs), 8);
    idx.write(reinterpret_cast<const char*>(offsets_.data()), static_cast<std::streamsize>(8 * offsets_.size()));
    if (!idx.flush()) throw std::runtime_error("cannot write '" + idx_path_.string() + "'");
    split["tokens"] = tokens_;
    split["documents"] = n_docs;
    split["xxh3"] = xxh3_text(XXH3_64bits_digest(&hash_));
    return split;
  }
  int64_t tokens() const { return tokens_; }

 private:
  void put(int32_t id) {
    const uint32_t v = static_cast<uint32_t>(id);
    if (bytes_ == 2) {
      const uint16_t s = static_cast<uint16_t>(v);
      buf_.append(reinterpret_cast<const char*>(&s), 2);
    } else {
      buf_.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  fs::path bin_path_, idx_path_, mask_path_;
  int bytes_;
  bool loss_mask_;
  std::ofstream out_, mask_out_;
  std::string buf_;
  XXH3_state_t hash_, mask_hash_;
  int64_t tokens_ = 0;
  std::vector<uint64_t> offsets_;
};

constexpr char kPromptCompletion[] = "prompt-completion";
constexpr char kMessages[] = "messages";

// Calls fn(spans) for each document of `contents`, the file `path`: with the text format
// each document between blank lines, all of it counted; with prompt-completion each
// example, its prompt not counted; with messages each conversation as `chat` writes it.
template <class F>
void for_each_document(const PrepareOptions& opt, std::optional<ChatTemplate> chat, std::string_view contents,
                       const std::string& path, F&& fn) {
  if (opt.format == kPromptCompletion) {
    for (auto& example : read_prompt_completions(contents, path))
      fn(std::vector<TextSpan>{{std::move(example.prompt), false}, {std::move(example.completion), true}});
  } else if (opt.format == kMessages) {
    for (const auto& conversation : read_conversations(contents, path))
      fn(render_conversation(chat.value(), conversation));
  } else {
    for (const auto doc : split_documents(contents)) fn(std::vector<TextSpan>{{std::string(doc), true}});
  }
}

// The texts of `contents` a vocabulary is trained on: documents, prompts and completions,
// messages' contents (never a template's markup, which is special tokens).
std::vector<std::string> vocabulary_sample(const PrepareOptions& opt, std::string_view contents,
                                           const std::string& path) {
  std::vector<std::string> out;
  if (opt.format == kPromptCompletion) {
    for (auto& example : read_prompt_completions(contents, path)) {
      if (!example.prompt.empty()) out.push_back(std::move(example.prompt));
      out.push_back(std::move(example.completion));
    }
  } else if (opt.format == kMessages) {
    for (auto& conversation : read_conversations(contents, path))
      for (auto& m : conversation.messages) out.push_back(std::move(m.content));
  } else {
    for (const auto doc : split_documents(contents)) out.emplace_back(doc);
  }
  return out;
}

bool made_here(const PrepareOptions& opt) { return opt.tokenizer == "bpe" || opt.tokenizer == "bytes"; }

// The tokenizer tide makes when opt.tokenizer is "bpe" (trained here on the first
// bpe_sample_mb of the inputs' texts) or "bytes", with `chat`'s special tokens.
std::unique_ptr<Tokenizer> make_tokenizer(const PrepareOptions& opt, std::optional<ChatTemplate> chat,
                                          const std::vector<std::string>& files, const Progress& report) {
  auto made = std::make_unique<ByteLevelBpe>(ByteLevelBpe::bytes());
  if (opt.tokenizer == "bpe") {
    std::vector<std::string> sample;
    int64_t taken = 0;
    for (const auto& f : files) {
      if (taken >= opt.bpe_sample_mb << 20) break;
      const std::string contents = read_file(f);
      taken += static_cast<int64_t>(contents.size());
      for (auto& text : vocabulary_sample(opt, contents, f)) sample.push_back(std::move(text));
    }
    const std::vector<std::string_view> views(sample.begin(), sample.end());
    *made = train_bpe(views, opt.vocab_size, [&](int64_t d, int64_t t) { report("train bpe", d, t); });
  }
  if (chat) made->add_special_tokens(chat_special_tokens(*chat));
  return made;
}

// The chat template of a messages dataset: the one named (whose special tokens `file`,
// the tokenizer file named, must have; tide adds them to the ones it makes, null here),
// else the one whose special tokens `file` has.
std::optional<ChatTemplate> chosen_template(const PrepareOptions& opt, const Tokenizer* file) {
  if (opt.format != kMessages) {
    if (!opt.chat_template.empty())
      throw std::invalid_argument("chat template '" + opt.chat_template + "' is for --format messages, not " +
                                  opt.format);
    return std::nullopt;
  }
  if (!opt.chat_template.empty()) {
    const ChatTemplate named = chat_template_named(opt.chat_template);
    if (file) check_chat_tokens(named, *file, opt.tokenizer);
    return named;
  }
  if (!file)
    throw std::invalid_argument("--format messages with tokenizer '" + opt.tokenizer +
                                "' needs a chat template named (llama3, chatml, gemma): its vocabulary is made here");
  const auto found = chat_template_of(*file);
  if (!found)
    throw std::invalid_argument("tokenizer '" + opt.tokenizer +
                                "' has the special tokens of no chat template tide knows (llama3, chatml, gemma): "
                                "name one with --chat-template");
  return found;
}

}  // namespace

PrepareReport prepare_dataset(const PrepareOptions& opt, const Progress& progress) {
  if (opt.val_fraction < 0 || opt.val_fraction >= 1)
    throw std::invalid_argument("val fraction " + std::to_string(opt.val_fraction) + " is outside [0, 1)");
  if (opt.format != "text" && opt.format != kPromptCompletion && opt.format != kMessages)
    throw std::invalid_argument("format '" + opt.format + "' is none of 'text', 'prompt-completion', 'messages'");
  const bool loss_mask = opt.format != "text";
  // A tokenizer file is read first: it may choose the chat template the examples are
  // checked in before anything is tokenised.
  std::unique_ptr<Tokenizer> tok = made_here(opt) ? nullptr : load_tokenizer(opt.tokenizer);
  const std::optional<ChatTemplate> chat = chosen_template(opt, tok.get());
  const auto files = list_inputs(opt.inputs);
  auto report = [&](const std::string& stage, int64_t done, int64_t total) {
    if (progress) progress(stage, done, total);
  };

  // Pass 1: sizes and document count (the validation documents are spread evenly); every
  // example is read and rendered, so a bad one stops the prepare before anything is written.
  int64_t total_bytes = 0, total_docs = 0;
  for (const auto& f : files) {
    const std::string text = read_file(f);
    total_bytes += static_cast<int64_t>(text.size());
    for_each_document(opt, chat, text, f, [&](const std::vector<TextSpan>&) { ++total_docs; });
  }
  if (total_docs == 0) throw std::runtime_error("the inputs hold no text");

  if (!tok) tok = make_tokenizer(opt, chat, files, report);
  const int64_t vocab = tok->vocab_size();
  if (tok->eos_id() < 0) throw std::runtime_error("tokenizer '" + opt.tokenizer + "' has no end-of-text token");
  const int dtype_bytes = vocab <= 65536 ? 2 : 4;

  const fs::path final_dir(opt.out_dir);
  const fs::path tmp_dir = final_dir.string() + ".tmp-" + std::to_string(::getpid());
  fs::remove_all(tmp_dir);
  fs::create_directories(tmp_dir);
  // A prepare that fails part-way (a disk full, a tokenizer that cannot encode) leaves
  // neither the new dataset nor its pieces.
  struct RemoveUnlessRenamed {
    const fs::path& dir;
    ~RemoveUnlessRenamed() {
      std::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  } cleanup{tmp_dir};
  tok->save((tmp_dir / tok->file_name()).string());
  if (chat) {
    std::ofstream jinja(tmp_dir / kChatTemplateFile, std::ios::trunc);
    jinja << chat_template_jinja(*chat);
    if (!jinja.flush()) throw std::runtime_error("cannot write " + (tmp_dir / kChatTemplateFile).string());
  }

  SplitWriter train(tmp_dir, "train", dtype_bytes, loss_mask), val(tmp_dir, "val", dtype_bytes, loss_mask);
  const int64_t every = opt.val_fraction > 0 ? std::max<int64_t>(2, std::llround(1.0 / opt.val_fraction)) : 0;
  int64_t doc_index = 0, bytes_done = 0;
  for (const auto& f : files) {
    const std::string text = read_file(f);
    for_each_document(opt, chat, text, f, [&](const std::vector<TextSpan>& spans) {
      const bool to_val = every > 0 && (doc_index % every == every / 2 || (total_docs < every && doc_index == total_docs - 1 && total_docs > 1));
      (to_val ? val : train).add_document(encode_spans(*tok, spans), tok->eos_id());
      ++doc_index;
    });
    bytes_done += static_cast<int64_t>(text.size());
    report("tokenize", bytes_done, total_bytes);
  }
  nlohmann::json sources = nlohmann::json::array();
  for (const auto& f : files) sources.push_back(f);
  nlohmann::json meta = {{"format", "tide-tokens"},
                         {"version", kDatasetFormatVersion},
                         {"dtype", dtype_bytes == 2 ? "uint16" : "uint32"},
                         {"vocab_size", vocab},
                         {"eos_id", tok->eos_id()},
                         {"tokenizer", tok->file_name()},
                         {"document_separator", loss_mask ? "json lines" : "blank line"},
                         {"splits", {{"train", train.finish()}, {"val", val.finish()}}},
                         {"sources", sources},
                         {"bytes", total_bytes}};
  if (loss_mask) meta["loss_mask"] = true;
  if (chat) meta["chat_template"] = chat_template_name(*chat);
  {
    std::ofstream out(tmp_dir / "dataset.json", std::ios::trunc);
    out << meta.dump(2) << "\n";
    if (!out.flush()) throw std::runtime_error("cannot write dataset.json in '" + tmp_dir.string() + "'");
  }
  fs::remove_all(final_dir);
  fs::rename(tmp_dir, final_dir);

  PrepareReport r;
  r.documents = total_docs;
  r.train_tokens = train.tokens();
  r.val_tokens = val.tokens();
  r.bytes = total_bytes;
  r.vocab_size = vocab;
  return r;
}

}  // namespace tide
