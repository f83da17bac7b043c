// A small prepared dataset written with the real `data prepare` code.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <sys/types.h>
#include <unistd.h>

#include "tide/engine/config.h"
#include "tide/engine/data/dataset_writer.h"
#include "tiny_models.h"

namespace tide::testing {

// Removes a directory when the process that made it exits (not a child it forked, which
// inherits the object and exits first).
class RemovedAtExit {
 public:
  explicit RemovedAtExit(std::filesystem::path dir) : dir_(std::move(dir)), owner_(::getpid()) {}
  ~RemovedAtExit() {
    std::error_code ignored;
    if (::getpid() == owner_) std::filesystem::remove_all(dir_, ignored);
  }
  RemovedAtExit(const RemovedAtExit&) = delete;
  RemovedAtExit& operator=(const RemovedAtExit&) = delete;

 private:
  std::filesystem::path dir_;
  pid_t owner_;
};

// Prepares a dataset of the license texts `files` (every Debian machine has them) with
// `tokenizer` ("bytes", "bpe") under a directory named `tag`, removed when the process
// exits, and returns its directory.
inline std::string license_dataset(const std::string& tag, const std::vector<std::string>& files,
                                   const std::string& tokenizer, int64_t vocab_size = 8192) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("tide_test_data_" + tag + "_" + std::to_string(::getpid()));
  static std::vector<std::unique_ptr<RemovedAtExit>> cleanups;
  cleanups.push_back(std::make_unique<RemovedAtExit>(root));
  fs::remove_all(root);
  fs::create_directories(root / "text");
  int n = 0;
  for (const auto& name : files) {
    const fs::path f = fs::path("/usr/share/common-licenses") / name;
    if (fs::exists(f)) fs::copy_file(f, root / "text" / (std::to_string(n++) + ".txt"));
  }
  PrepareOptions opt;
  opt.inputs = {(root / "text").string()};
  opt.out_dir = (root / "ds").string();
  opt.tokenizer = tokenizer;
  opt.vocab_size = vocab_size;
  opt.val_fraction = 0.1;
  prepare_dataset(opt);
  return opt.out_dir;
}

// A byte-tokenised dataset of three licenses, prepared once per process.
inline std::string small_dataset() {
  static const std::string dir = license_dataset("small", {"GPL-3", "Apache-2.0", "MPL-2.0"}, "bytes");
  return dir;
}

// The prompt-completion examples of the file `jsonl` as a dataset of byte ids in `out`,
// `val_fraction` of them held out; returns `out`.
inline std::string prepare_prompt_completions(const std::string& jsonl, const std::string& out, double val_fraction) {
  PrepareOptions opt;
  opt.inputs = {jsonl};
  opt.out_dir = out;
  opt.tokenizer = "bytes";
  opt.val_fraction = val_fraction;
  opt.format = "prompt-completion";
  prepare_dataset(opt);
  return out;
}

// A byte-tokenised prompt-completion dataset (`--format prompt-completion`), prepared once
// per process: 60 examples whose prompts are capital letters only and whose completions
// hold none, so a target's byte says whether it is a prompt's (uncounted) or a
// completion's; lengths vary with the example (prompts 6-27 bytes, completions 8-49).
inline std::string prompt_completion_dataset() {
  namespace fs = std::filesystem;
  static const std::string dir = [] {
    const fs::path root = fs::temp_directory_path() / ("tide_test_data_sft_" + std::to_string(::getpid()));
    static RemovedAtExit cleanup(root);
    fs::remove_all(root);
    fs::create_directories(root);
    std::ofstream jsonl(root / "examples.jsonl");
    for (int i = 0; i < 60; ++i) {
      std::string prompt = "ASK", completion;
      for (int j = 0; j < 3 + (i * 7) % 22; ++j) prompt += static_cast<char>('A' + (i + j) % 26);
      for (int j = 0; j < 5 + (i * 11) % 40; ++j) completion += static_cast<char>('a' + (i * 3 + j) % 26);
      jsonl << "{\"prompt\": \"" << prompt << "\", \"completion\": \" " << completion << " " << i << "\"}\n";
    }
    jsonl.close();
    return prepare_prompt_completions((root / "examples.jsonl").string(), (root / "ds").string(), 0.1);
  }();
  return dir;
}

// The names of the files in `dir`, sorted (what a run wrote there).
inline std::vector<std::string> file_names(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  for (const auto& f : std::filesystem::directory_iterator(dir)) names.push_back(f.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// tiny_llama on small_dataset(): 8 windows of 32 tokens per step in two micro-batches of
// 4, one thread, no evaluation. Tests set what they study on top.
inline RunConfig tiny_byte_run(const std::string& name) {
  RunConfig c;
  c.name = name;
  c.model = tiny_llama();
  c.model.vocab_size = 257;  // bytes + end-of-text
  c.data.path = small_dataset();
  c.data.seq_len = 32;
  c.batch.micro_batch = 4;
  c.batch.global_batch = 8;
  c.eval.every = 0;
  c.threads = 1;
  return c;
}

}  // namespace tide::testing
