// `tide data prepare`: texts → a token dataset directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tide/engine/io/progress.h"

namespace tide {

class Tokenizer;

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or folders (recursed, sorted)
  std::string out_dir;
  // "bpe" (train on the corpus), "bytes", or a path to a tokenizer.json.
  std::string tokenizer = "bpe";
  int64_t vocab_size = 8192;
  double val_fraction = 0.01;     // of documents, spread evenly through the corpus
  int64_t bpe_sample_mb = 64;     // text used to train BPE
  // "text": documents separated by blank lines; "prompt-completion": JSON lines of
  // examples (fine_tuning_examples.h), each a document whose loss mask (<split>.mask)
  // counts the completion's tokens and its end-of-text, not the prompt's; "messages":
  // JSON lines of conversations, each a document written by `chat_template` whose mask
  // counts the assistant's turns and the end-of-text.
  std::string format = "text";
  // With "messages": "llama3", "chatml" or "gemma" (chat_template.h); empty: the one
  // whose special tokens the tokenizer file has. The vocabularies tide makes ("bpe",
  // "bytes") get the named template's special tokens added.
  std::string chat_template;
};

struct PrepareReport {
  int64_t documents = 0, train_tokens = 0, val_tokens = 0, bytes = 0, vocab_size = 0;
};

// Each document ends with the end-of-text id. Its stages report through `progress`.
PrepareReport prepare_dataset(const PrepareOptions& opt, const Progress& progress = {});

// Splits text into documents at runs of blank lines (trimmed, empty ones dropped).
std::vector<std::string_view> split_documents(std::string_view text);

}  // namespace tide
