#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "auto_layout.h"
#include "controlled_worker.h"
#include "launcher.h"
#include "local_policies.h"
#include "tide/engine/data/training_data.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/parallel/launch_env.h"
#include "tide/engine/plan/cluster.h"
#include "tide/engine/run_layout.h"
#include "tide/engine/train/fault_injection.h"
#include "tide/engine/train/initial_weights.h"
#include "tide/engine/train/runtime.h"
#include "tide/engine/train/trainer.h"
#include "tide/scripting/recipe.h"
#include "tide/worker/commands.h"
#include "tide/worker/stop_signals.h"

namespace tide::worker {
namespace {

struct Options {
  std::string recipe, run_dir, master, resume;
  std::vector<std::string> overrides;
  double peak_tflops = 0;
  bool quiet = false, auto_layout = false;
  int nproc = 1, nnodes = 1, node_rank = 0;
};

// This process starts nproc workers (of nnodes machines), each a `tide-worker train` of one rank.
void launch_training(const Options& opt, const RunConfig& cfg, const std::string& dir) {
  check_supported_layout(cfg, opt.nproc * opt.nnodes);
  // Weights that do not fit are refused once, here, not by every rank after it started.
  // A resumed run reads its checkpoint, not them.
  if (opt.resume.empty() && !cfg.checkpoint.init_from.empty())
    check_initial_weights(cfg.checkpoint.init_from, cfg.model);
  // So are datasets that cannot be read or blended (their token files each rank reads).
  // Another node's ranks may see paths this one does not.
  check_training_data(cfg.data, std::filesystem::current_path().string(), opt.nnodes > 1);
  ipc::WorkerSpec spec;
  spec.nproc = opt.nproc;
  spec.nnodes = opt.nnodes;
  spec.node_rank = opt.node_rank;
  if (!opt.master.empty()) {
    const auto colon = opt.master.rfind(':');
    if (colon == std::string::npos) throw std::invalid_argument("--master '" + opt.master + "' is not host:port");
    spec.master_addr = opt.master.substr(0, colon);
    spec.master_port = std::stoi(opt.master.substr(colon + 1));
  } else if (opt.nnodes > 1) {
    throw std::invalid_argument("--nnodes " + std::to_string(opt.nnodes) + " needs --master host:port");
  }
  spec.executable = worker_beside_self();
  spec.args = {"train", opt.recipe, "--run-dir", dir};
  for (const auto& o : opt.overrides) spec.args.insert(spec.args.end(), {"--set", o});
  if (opt.peak_tflops > 0) spec.args.insert(spec.args.end(), {"--peak-tflops", fmt::format("{}", opt.peak_tflops)});
  if (opt.quiet) spec.args.push_back("--quiet");
  if (!opt.resume.empty()) spec.args.insert(spec.args.end(), {"--resume", opt.resume});
  if (const int rc = launch_workers(spec); rc != 0) throw std::runtime_error("training failed");
}

// A run without a controller: rank 0 runs the recipe's policies, and every rank takes
// part in live control (rank 0 broadcasts its commands at each step boundary); rank 0's
// stop signal decides for all, whoever launched the ranks.
void control_locally(TrainHooks& hooks, const std::shared_ptr<Recipe>& recipe, bool leader) {
  run_policies_locally(hooks, recipe, leader);
  install_stop_signals();
  hooks.controlled = true;
  hooks.take_commands = [policy_commands = hooks.take_commands] {
    const std::string policy = policy_commands ? policy_commands() : std::string();
    const std::string stop = take_stop_command();
    if (stop.empty() || policy.empty()) return policy + stop;
    // Both in one boundary: the policy's commands, then the stop.
    auto commands = nlohmann::json::parse(policy);
    commands.push_back(nlohmann::json::parse(stop).at(0));
    return commands.dump();
  };
}

// One rank of a job of several processes.
void train_as_rank(const LaunchEnv& env, RunConfig cfg, const std::string& dir, const TrainHooks& hooks,
                   ipc::WorkerLink* link) {
  if (cfg.threads == 0) cfg.threads = std::max(1, local_cores() / env.local_world);  // ranks of a host share it
  if (env.rank != 0) spdlog::set_level(spdlog::level::warn);
  spdlog::info("rank {} of {} (set by {}), rendezvous at {}:{}", env.rank, env.world, env.launcher, env.master_addr,
               env.master_port);
  try {
    auto dist = init_distributed(env, cfg.parallel,
                                 std::chrono::milliseconds(static_cast<int64_t>(cfg.parallel.timeout_s * 1000)),
                                 cfg.device == "cuda");
    report_result(link, Trainer(cfg, dir, hooks, dist.get()).run());
  } catch (const std::exception& e) {
    report_failure(link, e.what());
    throw std::runtime_error(fmt::format("rank {}: {}", env.rank, e.what()));
  }
}

void print_outcome(const TrainResult& r) {
  if (r.stopped) {
    spdlog::info("stopped at step {} (checkpoint saved); `--resume auto` continues from it", r.steps);
    return;
  }
  spdlog::info("trained {} steps; final loss {:.4f}", r.steps, r.final_loss);
  if (r.final_val_loss)
    spdlog::info("validation loss {:.4f} (unigram baseline {:.4f}, perplexity {:.1f})", *r.final_val_loss,
                 r.unigram_baseline, std::exp(*r.final_val_loss));
  spdlog::info("weights: {}", r.weights_path);
}

void run_training(Options opt) {
  if (opt.auto_layout) opt.overrides.emplace_back("parallel.auto=true");
  auto recipe = std::make_shared<Recipe>(Recipe::load_file(resolve_recipe_path(opt.recipe), opt.overrides));
  const auto env = launch_env_from_environment();
  if (recipe->config().parallel.auto_layout) {
    // Decided once here and handed to the workers as overrides; ranks that start on their
    // own (or one launcher per node) decide each, from stored figures.
    const bool launcher = opt.nproc > 1 || opt.nnodes > 1;
    const int per_node = launcher ? opt.nproc : (env ? env->local_world : 1);
    const int world_nodes = launcher ? opt.nnodes : (env ? std::max(1, env->world / std::max(1, env->local_world)) : 1);
    const bool independent = (launcher && opt.nnodes > 1) || (!launcher && env && env->world > 1);
    for (auto& o : auto_layout_overrides(recipe->config(), world_nodes, per_node, independent))
      opt.overrides.push_back(std::move(o));
    recipe = std::make_shared<Recipe>(Recipe::load_file(resolve_recipe_path(opt.recipe), opt.overrides));
  }
  const RunConfig cfg = recipe->config();
  const std::string dir = opt.run_dir.empty() ? "runs/" + cfg.name : opt.run_dir;
  if (opt.nproc > 1 || opt.nnodes > 1) return launch_training(opt, cfg, dir);

  TrainHooks hooks;
  hooks.resume = opt.resume;
  hooks.show_progress = !opt.quiet;
  hooks.peak_flops = opt.peak_tflops * 1e12;
  hooks.loss_tap = loss_tap_from_environment();  // tests' fault injection (docs/daemon.md)
  if (recipe->has_lr_function()) hooks.lr = [recipe](int64_t step) { return recipe->lr_at(step); };
  // Under a controller the controller runs the policies and sends the commands.
  const auto link = attach_controller(hooks, recipe->has_policy("on_anomaly"), env ? env->rank : 0);
  if (!link) control_locally(hooks, recipe, !env || env->rank == 0);
  if (env && env->world > 1) return train_as_rank(*env, cfg, dir, hooks, link.get());
  TrainResult r;
  try {
    r = Trainer(cfg, dir, hooks).run();
  } catch (const std::exception& e) {
    report_failure(link.get(), e.what());
    throw;
  }
  report_result(link.get(), r);
  print_outcome(r);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto opt = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("train", "Train a model from a recipe, in this process or in several worker processes");
  cmd->add_option("recipe", opt->recipe, "Recipe file, or a bundled name such as llama/llama-tiny")->required();
  add_overrides(*cmd, opt->overrides);
  cmd->add_option("--run-dir", opt->run_dir, "Run directory (default: runs/<recipe name>)");
  cmd->add_option("--peak-tflops", opt->peak_tflops,
                  "Peak FLOP/s (in TFLOP/s) of one process for MFU; default: measured with a matmul probe");
  cmd->add_flag("--quiet", opt->quiet, "No progress line");
  cmd->add_flag("--auto", opt->auto_layout,
                "Let the planner choose the layout and micro-batch for these ranks (parallel.auto; tide plan shows "
                "the ranking)");
  cmd->add_option("--resume", opt->resume,
                  "Continue from a checkpoint: 'auto' (the newest valid one in the run directory, else start afresh) "
                  "or a step directory (any layout wrote it)");
  cmd->add_option("--nproc", opt->nproc, "Worker processes on this machine (one per device)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--nnodes", opt->nnodes, "Machines in the job")->check(CLI::Range(1, 100000));
  cmd->add_option("--node-rank", opt->node_rank, "This machine's index in [0, nnodes)")->check(CLI::Range(0, 100000));
  cmd->add_option("--master", opt->master,
                  "host:port of node 0's rendezvous store (default for one node: 127.0.0.1 and a free port)");
  cmd->footer(
      "A process started with WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in its environment (as "
      "torchrun sets them; JOB_COMPLETION_INDEX, a Kubernetes Indexed Job's, stands for RANK), or as a task of "
      "Slurm's srun (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; the rendezvous on the step's first node), runs as "
      "that rank. SIGUSR1, SIGTERM and SIGINT stop it at the next step boundary after a checkpoint.");
  cmd->callback([opt] { run_training(*opt); });
}

}  // namespace tide::worker
