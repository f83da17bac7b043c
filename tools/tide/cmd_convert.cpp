#include <memory>

#include <spdlog/spdlog.h>

#include "cli_common.h"
#include "tide/engine/train/run_files.h"

namespace tide::cli {

void add_convert_command(CLI::App& app) {
  // Both directions stream: one tensor in memory at a time, whatever the model's size.
  auto* convert = app.add_subcommand("convert", "Import and export Hugging Face safetensors weights");
  convert->require_subcommand(1);
  struct Options {
    std::string from, out, dtype = "F32";
    double max_shard_mb = 0;
  };
  auto opt = std::make_shared<Options>();

  auto* exp = convert->add_subcommand("export", "Write a Hugging Face directory (config.json + safetensors)");
  exp->add_option("model", opt->from, "Run directory or weights file")->required();
  exp->add_option("-o,--out", opt->out, "Directory to write")->required();
  exp->add_option("--max-shard-mb", opt->max_shard_mb, "Shard above this size (MiB); 0: one file");
  exp->add_option("--dtype", opt->dtype, "F32, BF16 or F16")->check(CLI::IsMember({"F32", "BF16", "F16"}));
  exp->callback([opt] {
    convert_weights(opt->from, opt->out, /*hf_dir=*/true, static_cast<int64_t>(opt->max_shard_mb * 1024 * 1024),
                    opt->dtype);
    spdlog::info("wrote {}", opt->out);
  });

  auto* imp = convert->add_subcommand("import", "Read a Hugging Face directory into a tide weights file");
  imp->add_option("hf_dir", opt->from, "Hugging Face directory (config.json + safetensors)")->required();
  imp->add_option("-o,--out", opt->out, "Directory to write model.safetensors (and tokenizer.json) into")->required();
  imp->callback([opt] {
    convert_weights(opt->from, opt->out, /*hf_dir=*/false);
    spdlog::info("wrote {}/model.safetensors", opt->out);
  });
}

}  // namespace tide::cli
