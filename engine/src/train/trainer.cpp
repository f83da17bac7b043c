#include "tide/engine/train/trainer.h"

#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "tide/engine/checkpoint/checkpoint.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/data/training_data.h"
#include "tide/engine/io/std_binding.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/parallel/comm.h"
#include "tide/engine/parallel/data_parallel.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/parallel/grid.h"
#include "tide/engine/parallel/launch_env.h"
#include "tide/engine/parallel/parallelize.h"
#include "tide/engine/run_layout.h"
#include "tide/engine/train/run_files.h"
#include "tide/engine/train/runtime.h"
#include "tide/engine/train/tensor_memory.h"
#include "trainer_state.h"
#include "training_loop.h"

namespace tide {
namespace fs = std::filesystem;

namespace {
// The GPU of the rank that is local_rank-th on its host (cuda_device_of_local_rank).
c10::Device compute_device(const RunConfig& cfg, int local_rank) {
  if (cfg.device != "cuda") return torch::kCPU;
  if (!torch::cuda::is_available())
    throw ConfigError("device", "cuda: no CUDA device is visible, or this LibTorch was built without CUDA");
  const int gpus = static_cast<int>(torch::cuda::device_count());
  const bool share = cfg.parallel.backend == "gloo";
  try {
    return {torch::kCUDA, static_cast<c10::DeviceIndex>(cuda_device_of_local_rank(local_rank, gpus, share))};
  } catch (const std::invalid_argument& e) {
    throw ConfigError("device",
                      std::string("cuda: ") + e.what() + " (parallel.backend = \"gloo\" lets ranks share them)");
  }
}

// train.log for the leader (also to the hooks' sinks), train-rank<N>.log for the others.
std::shared_ptr<spdlog::logger> open_run_log(const Trainer::State& s) {
  const std::string name = s.leader ? "train.log" : fmt::format("train-rank{}.log", s.dist->world->rank());
  std::vector<spdlog::sink_ptr> sinks{
      std::make_shared<spdlog::sinks::basic_file_sink_mt>((s.dir / name).string(), false)};
  if (s.leader) sinks.insert(sinks.end(), s.hooks.log_sinks.begin(), s.hooks.log_sinks.end());
  auto log = std::make_shared<spdlog::logger>("train", sinks.begin(), sinks.end());
  log->set_level(spdlog::level::from_str(s.cfg.log_level));
  log->flush_on(spdlog::level::info);
  return log;
}

void describe(const Trainer::State& s, int threads) {
  const auto& cfg = s.cfg;
  const std::string intro = fmt::format(
      "run '{}': {} parameters{}, {} threads, {} sequences of {} tokens per step ({} micro-batches of {}{})", cfg.name,
      parameter_count(cfg.model),
      cfg.model.lora_rank > 0
          ? fmt::format(" ({} trained: LoRA adapters of rank {} on {})", lora_parameter_count(cfg.model),
                        cfg.model.lora_rank, fmt::join(lora_target_names(cfg.model), ", "))
          : "",
      threads, cfg.batch.global_batch, cfg.data.seq_len, accumulation_steps(cfg.batch.global_batch, s.batch),
      s.batch.micro_batch,
      s.dist ? fmt::format(" on each of {} ranks, {}{}, ZeRO-{}{}", s.batch.dp, s.dist->grid.describe(),
                           cfg.parallel.ep > 1 ? fmt::format(", experts over ep{}", cfg.parallel.ep) : "",
                           cfg.parallel.zero, cfg.parallel.offload_optimizer ? " with optimizer offload" : "")
             : "");
  s.log->info("{}", intro);
  if (s.leader) spdlog::info("{}", intro);
  if (cfg.model.lora_rank > 0 && cfg.checkpoint.init_from.empty() && s.leader)
    spdlog::warn(
        "model.lora_rank without checkpoint.init_from: the adapters train on base weights drawn from the "
        "seed, not on a trained model");
  if (s.data->size() > 1) {
    std::vector<std::string> shares;
    for (size_t i = 0; i < s.data->size(); ++i)
      shares.push_back(fmt::format("{} {:.1f}% ({}, {} train tokens)", s.data->name(i), 100 * s.data->share(i),
                                   s.data->dataset(i).dir(), s.data->dataset(i).split("train").size()));
    s.log->info("data blend: {}", fmt::join(shares, "; "));
  }
  if (s.pm.expert_flat) {
    const Comm& holders = *s.dist->expert_replicas;
    const int64_t each = cfg.model.moe_experts / cfg.parallel.ep, first = s.dist->ep->rank() * each;
    s.log->info(
        "expert parallelism: experts [{}, {}) of each block's {} on this rank ({} elements in their buffer), "
        "spread over ep = {}; {}",
        first, first + each, cfg.model.moe_experts, s.pm.expert_flat->numel(), cfg.parallel.ep,
        holders.size() == 1 ? "no other rank holds them"
                            : fmt::format("{} ranks hold them and reduce their gradients together", holders.size()));
  }
  if (s.pm.frozen) {
    s.log->info("LoRA: ZeRO-3 shards the frozen base: {} of its {} elements on each of {} data-parallel ranks, in {}",
                s.pm.frozen->shard_numel(static_cast<int>(s.batch.replicas())), s.pm.frozen->numel(),
                s.batch.replicas(), c10::toString(s.pm.data_parallel->frozen_shard().scalar_type()));
  } else if (cfg.model.lora_rank > 0) {
    int64_t elements = 0, narrow = 0, bytes = 0;
    for (const auto& p : s.pm.model->parameters()) {
      if (p.requires_grad()) continue;
      elements += p.numel();
      narrow += p.scalar_type() == at::kFloat ? 0 : p.numel();
      bytes += static_cast<int64_t>(p.nbytes());
    }
    s.log->info("LoRA: the frozen base held whole, {} MiB: {} of its {} elements (the matrices) in the compute dtype",
                bytes >> 20, narrow, elements);
  }
  const PipelineStage& st = s.pm.stage;
  if (s.pm.pipeline) {
    std::vector<std::string> chunks;
    for (const auto& c : st.chunks) chunks.push_back(fmt::format("[{}, {})", c.first, c.end));
    s.log->info("pipeline stage {} of {}: blocks {}{}{}, {} schedule{}", s.dist->pp->rank(), s.dist->pp->size(),
                fmt::join(chunks, " "), st.first ? ", embeddings" : "", st.last ? ", output head" : "",
                cfg.parallel.pipeline_schedule,
                st.chunks.size() > 1 ? fmt::format(" interleaved over {} virtual stages", st.chunks.size()) : "");
  }
}
}  // namespace

Trainer::Trainer(const RunConfig& cfg, std::string run_dir, TrainHooks hooks, Distributed* dist)
    : s_(std::make_unique<State>()) {
  auto& s = *s_;
  check_std_library_binding();
  validate(cfg);
  const int world = dist ? dist->world->size() : 1;
  check_supported_layout(cfg, world);
  s.cfg = cfg;
  s.device = compute_device(cfg, dist ? dist->env.local_rank : 0);
  s.cfg.precision.compute = resolve_compute_dtype(cfg.precision.compute, s.device);
  s.dir = run_dir;
  s.hooks = std::move(hooks);
  s.dist = dist;
  s.leader = !dist || dist->world->rank() == 0;
  s.dp_rank = dist ? dist->grid.coords().dp : 0;  // the batches it reads (its cp ranks read the same)
  s.batch = batch_layout(cfg, world);
  fs::create_directories(s.dir);
  if (s.leader) std::ofstream(s.dir / "config.json", std::ios::trunc) << config_to_json(s.cfg).dump(2) << "\n";
  s.log = open_run_log(s);
  if (cfg.precision.compute == DType::Auto && s.device.is_cpu()) {
    const auto bf16 = host_bf16_instructions();
    if (!bf16.empty())
      s.log->info(
          "precision.compute = \"auto\" is fp32 on the CPU; this CPU multiplies bf16 in hardware ({}), "
          "where precision.compute = \"bf16\" trains faster, with bf16's rounding",
          bf16);
  }

  const int threads = configure_threads(cfg.threads);
  // Before the model exists: every tensor of the run is counted (peak_host_tensor_mb).
  count_host_tensor_memory();
  // Dropout masks differ between data-parallel ranks, as they would between batches, and
  // between the context-parallel ranks of one sequence, as they do along it.
  torch::manual_seed(static_cast<uint64_t>(cfg.seed) +
                     1000003ull * static_cast<uint64_t>(dist ? dist->replicas().rank() : 0));
  s.data = std::make_unique<TrainingData>(cfg.data);
  if (s.data->vocab_size() > cfg.model.vocab_size)
    throw ConfigError("model.vocab_size",
                      fmt::format("{} is smaller than the dataset's vocabulary of {} ids ({})", cfg.model.vocab_size,
                                  s.data->vocab_size(), s.data->dataset(0).dir()));
  s.log->info("placing the model's {} parameters on {}", parameter_count(cfg.model), s.device.str());
  const auto placing = std::chrono::steady_clock::now();
  s.pm = parallelize(s.cfg, dist, s.batch, s.device);
  // Building and placing the model needs no more host memory than the placed parameters
  // and optimizer state hold (parallelize.h): the figures a large run's start is judged by.
  const int64_t held = host_tensor_bytes(), peak = peak_host_tensor_bytes();
  s.log->info(
      "model state placed in {:.1f} s: host tensors hold {} bytes ({:.1f} MiB), at most {} bytes ({:.1f} MiB) while "
      "placing{}",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - placing).count(), held,
      static_cast<double>(held) / (1 << 20), peak, static_cast<double>(peak) / (1 << 20),
      s.device.is_cuda() ? fmt::format("; {} peak {:.1f} MiB", s.device.str(), peak_device_mb(s.device)) : "");
  s.checkpointer = std::make_unique<Checkpointer>(
      (s.dir / "checkpoints").string(),
      CheckpointParts{&s.cfg, s.pm.model.get(), s.pm.flat.get(), s.pm.optim.get(), dist, s.pm.frozen.get(),
                      s.pm.data_parallel.get(), s.pm.expert_flat.get(), s.pm.expert_optim.get()});
  if (s.leader && fs::exists(s.data->tokenizer_path())) copy_tokenizer(s.data->tokenizer_path(), s.dir);
  describe(s, threads);
}

Trainer::State::State() = default;
Trainer::State::~State() = default;

Trainer::~Trainer() {
  if (!s_ || !s_->checkpointer) return;
  // Unwinding from a failure (a lost peer, a collective that failed): the save in flight
  // may wait for files that will never come; the committed checkpoints stand.
  if (std::uncaught_exceptions() > 0)
    s_->checkpointer->abandon();
  else
    s_->checkpointer->wait();
}

TrainResult Trainer::run() { return TrainingLoop(*s_).run(); }

}  // namespace tide
