#include <memory>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cli_common.h"
#include "tide/engine/train/trainer.h"
#include "tide/scripting/recipe.h"

namespace tide::cli {

void add_train_command(CLI::App& app) {
  struct Options {
    std::string recipe, run_dir;
    std::vector<std::string> overrides;
    double peak_tflops = 0;
    bool quiet = false;
  };
  auto opt = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("train", "Train a model from a recipe in this process");
  cmd->add_option("recipe", opt->recipe, "Recipe file, or a bundled name such as llama/llama-tiny")->required();
  add_overrides(*cmd, opt->overrides);
  cmd->add_option("--run-dir", opt->run_dir, "Run directory (default: runs/<recipe name>)");
  cmd->add_option("--peak-tflops", opt->peak_tflops,
                  "Peak FLOP/s (in TFLOP/s) for MFU; default: measured with a matmul probe");
  cmd->add_flag("--quiet", opt->quiet, "No progress line");
  cmd->callback([opt] {
    auto recipe = std::make_shared<Recipe>(Recipe::load_file(resolve_recipe_path(opt->recipe), opt->overrides));
    const RunConfig& cfg = recipe->config();
    const std::string dir = opt->run_dir.empty() ? "runs/" + cfg.name : opt->run_dir;
    TrainHooks hooks;
    hooks.show_progress = !opt->quiet;
    hooks.peak_flops = opt->peak_tflops * 1e12;
    if (recipe->has_lr_function()) hooks.lr = [recipe](int64_t step) { return recipe->lr_at(step); };
    Trainer trainer(cfg, dir, hooks);
    const TrainResult r = trainer.run();
    spdlog::info("trained {} steps; final loss {:.4f}", r.steps, r.final_loss);
    if (r.final_val_loss)
      spdlog::info("validation loss {:.4f} (unigram baseline {:.4f}, perplexity {:.1f})", *r.final_val_loss,
                   r.unigram_baseline, std::exp(*r.final_val_loss));
    spdlog::info("weights: {}", r.weights_path);
  });
}

}  // namespace tide::cli
