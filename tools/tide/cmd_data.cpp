#include <unistd.h>

#include <memory>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli_common.h"
#include "tide/engine/data/chat_template.h"
#include "tide/engine/data/dataset_writer.h"

namespace tide::cli {

void add_data_command(CLI::App& app) {
  auto* data = app.add_subcommand("data", "Prepare datasets");
  data->require_subcommand(1);
  auto opt = std::make_shared<PrepareOptions>();
  auto* prep = data->add_subcommand("prepare",
                                    "Tokenise text files or folders (or fine-tuning examples: prompt-completion or "
                                    "chat JSON lines) into a token dataset");
  prep->add_option("inputs", opt->inputs, "Text files or folders")->required();
  prep->add_option("-o,--out", opt->out_dir, "Dataset directory to write")->required();
  prep->add_option("--tokenizer", opt->tokenizer,
                   "bpe (train on the corpus), bytes, or a Hugging Face tokenizer.json (byte-level BPE)")
      ->capture_default_str();
  prep->add_option("--vocab-size", opt->vocab_size, "Vocabulary size when training BPE")->capture_default_str();
  prep->add_option("--val-fraction", opt->val_fraction, "Share of documents held out for validation")
      ->capture_default_str();
  prep->add_option("--bpe-sample-mb", opt->bpe_sample_mb, "Text (MiB) used to train BPE")->capture_default_str();
  prep->add_option("--format", opt->format,
                   "text: documents separated by blank lines; prompt-completion: JSON lines "
                   "{\"prompt\": ..., \"completion\": ...}, each an example whose loss mask counts the "
                   "completion only; messages: JSON lines {\"messages\": [{\"role\": ..., \"content\": ...}]} "
                   "(or ShareGPT's {\"conversations\": [{\"from\": ..., \"value\": ...}]}), each a conversation "
                   "whose loss mask counts the assistant's turns only (train both with data.loss_mask = true)")
      ->check(CLI::IsMember({"text", "prompt-completion", "messages"}))
      ->capture_default_str();
  prep->add_option("--chat-template", opt->chat_template,
                   "With --format messages: llama3, chatml (Qwen) or gemma; by default the one whose special "
                   "tokens the tokenizer file has (needed with bpe and bytes, which get its tokens added)")
      ->check(CLI::IsMember(chat_template_names()));
  prep->callback([opt] {
    const bool tty = ::isatty(STDERR_FILENO) != 0;
    std::string last_stage;
    const PrepareReport r = prepare_dataset(*opt, [&](const std::string& stage, int64_t done, int64_t total) {
      const double pct = total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
      if (tty) {
        std::fprintf(stderr, "\r\033[2K%s: %.0f%%", stage.c_str(), pct);
        if (done >= total) std::fprintf(stderr, "\n");
      } else if (stage != last_stage || done >= total) {
        std::fprintf(stderr, "%s: %.0f%%\n", stage.c_str(), pct);
      }
      last_stage = stage;
    });
    spdlog::info("{}: {} documents, {} train + {} validation tokens from {} bytes, vocabulary {}", opt->out_dir,
                 with_commas(r.documents), with_commas(r.train_tokens), with_commas(r.val_tokens),
                 with_commas(r.bytes), r.vocab_size);
  });
}

}  // namespace tide::cli
