#include "tide/worker/commands.h"

#include <filesystem>
#include <iostream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "tide/engine/checkpoint/checkpoint_index.h"
#include "tide/engine/checkpoint/hf_export.h"
#include "tide/ipc/worker_group.h"
#include "tide/worker/progress_report.h"
#include "tide/worker/stop_signals.h"

namespace tide::worker {
namespace fs = std::filesystem;

void add_overrides(CLI::App& cmd, std::vector<std::string>& overrides) {
  cmd.add_option("--set", overrides, "Override a recipe field, e.g. --set optimizer.lr=1e-4 (repeatable)")
      ->type_name("KEY=VALUE");
}

namespace {
void add_progress_file(CLI::App& cmd, std::string& file) {
  cmd.add_option("--progress-file", file,
                 "Keep {\"stage\", \"done\", \"total\"} (bytes) up to date in this JSON file (what a daemon reads)")
      ->type_name("PATH");
}
}  // namespace

void add_export_command(CLI::App& app, const std::string& name) {
  struct Options {
    std::string dir, out, dtype = "F32", progress_file;
    bool adapter = false;
  };
  auto opt = std::make_shared<Options>();
  auto* exp = app.add_subcommand(name,
                                 "Write Hugging Face safetensors + config.json (and the run's tokenizer) from a "
                                 "checkpoint saved under any layout");
  exp->add_option("dir", opt->dir, "A step directory")->required();
  exp->add_option("-o,--out", opt->out, "Directory to write")->required();
  exp->add_option("--dtype", opt->dtype, "F32, BF16 or F16")->check(CLI::IsMember({"F32", "BF16", "F16"}));
  exp->add_flag("--adapter", opt->adapter,
                "A LoRA run's checkpoint: write its adapters alone as a PEFT adapter directory "
                "(adapter_config.json + adapter_model.safetensors), not the merged model");
  add_progress_file(*exp, opt->progress_file);
  exp->callback([opt] {
    ProgressReport report(opt->progress_file);
    if (opt->adapter)
      export_checkpoint_adapter(opt->dir, opt->out, opt->dtype, report.progress());
    else
      export_checkpoint_hf(opt->dir, opt->out, opt->dtype, report.progress());
    spdlog::info("wrote {}", opt->out);
  });
}

void add_verify_command(CLI::App& app, const std::string& name) {
  struct Options {
    std::string dir, progress_file;
  };
  auto opt = std::make_shared<Options>();
  auto* verify = app.add_subcommand(name, "Check every file's size and XXH3 hash against the manifest");
  verify->add_option("dir", opt->dir, "A step directory, or a run directory (its newest checkpoint)")->required();
  add_progress_file(*verify, opt->progress_file);
  verify->callback([opt] {
    std::string step_dir = opt->dir;
    if (!fs::exists(fs::path(step_dir) / "manifest.json")) {
      const fs::path root = fs::is_directory(fs::path(step_dir) / "checkpoints") ? fs::path(step_dir) / "checkpoints"
                                                                                 : fs::path(step_dir);
      const auto all = list_checkpoints(root.string());
      if (all.empty()) throw std::runtime_error(fmt::format("no committed checkpoint under {}", root.string()));
      step_dir = all.back().path;
    }
    ProgressReport report(opt->progress_file);
    require_sound_checkpoint(step_dir, report.progress());
    std::cout << fmt::format("{}: sound ({} files)\n", step_dir, read_manifest(step_dir)["files"].size());
  });
}

int run_command_line(CLI::App& app, int argc, char** argv) {
  spdlog::set_default_logger(spdlog::stderr_color_mt("tide"));
  spdlog::set_pattern("[%H:%M:%S] [%^%l%$] %v");
  std::string level = "info";
  app.add_option("--log-level", level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.parse_complete_callback([&] { spdlog::set_level(spdlog::level::from_str(level)); });
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    return 1;
  }
  // Stopped by a stop signal after saving its work: the shell's convention for a
  // command a signal ended.
  if (const int sig = stop_signal(); sig != 0) return 128 + sig;
  return 0;
}

std::string worker_beside_self() {
  const fs::path self = fs::read_symlink("/proc/self/exe").parent_path();
  const std::string found = ipc::find_tide_worker(self.string());
  return found.empty() ? (self / "tide-worker").string() : found;
}

}  // namespace tide::worker
