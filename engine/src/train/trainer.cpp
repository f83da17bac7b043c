#include "tide/engine/train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "tide/engine/checkpoint/checkpoint.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/data/batch_loader.h"
#include "tide/engine/data/token_dataset.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/parameter_units.h"
#include "tide/engine/model/tensor_parallel.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/optim/lr_schedule.h"
#include "tide/engine/parallel/comm.h"
#include "tide/engine/parallel/data_parallel.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/parallel/grid.h"
#include "tide/engine/parallel/pipeline.h"
#include "tide/engine/run_layout.h"
#include "tide/engine/train/evaluate.h"
#include "tide/engine/train/flops.h"
#include "tide/engine/train/run_files.h"
#include "tide/engine/train/runtime.h"
#include "anomaly.h"
#include "live_control.h"

namespace tide {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {
// Steps (1-based) whose loss is made NaN, from TIDE_INJECT_NAN_AT="12,30": a testing
// hook for the anomaly policies. Each is injected once per process, so a rollback that
// replays the step trains it normally.
std::set<int64_t> injected_nan_steps() {
  std::set<int64_t> out;
  if (const char* v = std::getenv("TIDE_INJECT_NAN_AT")) {
    std::stringstream in(v);
    for (std::string item; std::getline(in, item, ',');)
      if (!item.empty()) out.insert(std::stoll(item));
  }
  return out;
}

// A run rewrites the steps after the one it starts from: drop their old rows. Returns
// the loss of the last row kept (a run resumed at its end reports it as its final loss).
std::optional<double> truncate_metrics(const std::string& path, int64_t last_step) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::string kept, line;
  std::optional<double> last_loss;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.value("step", int64_t{0}) <= last_step) {
      kept += line + "\n";
      if (j.contains("loss") && j["loss"].is_number()) last_loss = j["loss"].get<double>();
    }
  }
  in.close();
  std::ofstream(path, std::ios::trunc) << kept;
  return last_loss;
}

// The GPU of the rank that is local_rank-th on its host. NCCL needs one GPU per rank;
// Gloo lets ranks share them, round robin.
c10::DeviceIndex cuda_device_index(const RunConfig& cfg, int local_rank) {
  const int gpus = static_cast<int>(torch::cuda::device_count());
  if (cfg.parallel.backend == "gloo") return static_cast<c10::DeviceIndex>(local_rank % gpus);
  if (local_rank >= gpus)
    throw ConfigError("device", fmt::format("cuda: this is local rank {} but {} GPU{} visible; NCCL needs a GPU "
                                            "per rank (parallel.backend = \"gloo\" lets ranks share them)",
                                            local_rank, gpus, gpus == 1 ? " is" : "s are"));
  return static_cast<c10::DeviceIndex>(local_rank);
}
}  // namespace


struct Trainer::State {
  RunConfig cfg;
  fs::path dir;
  TrainHooks hooks;
  Distributed* dist = nullptr;
  bool leader = true;  // writes the run directory and shows progress
  int dp_rank = 0;
  BatchLayout batch;  // dp ranks and the micro-batch, fixed for the job
  PipelineStage stage;
  std::unique_ptr<DataParallel> data_parallel;
  std::unique_ptr<Pipeline> pipeline;
  std::shared_ptr<spdlog::logger> log;
  std::unique_ptr<TokenDataset> data;
  Transformer model{nullptr};
  std::unique_ptr<FlatParameters> flat;
  std::unique_ptr<AdamW> optim;
  std::unique_ptr<Checkpointer> checkpointer;
  torch::Device device{torch::kCPU};
};

Trainer::Trainer(const RunConfig& cfg, std::string run_dir, TrainHooks hooks, Distributed* dist)
    : s_(std::make_unique<State>()) {
  validate(cfg);
  s_->cfg = cfg;
  s_->dir = run_dir;
  s_->hooks = std::move(hooks);
  s_->dist = dist;
  if (dist) {
    s_->leader = dist->world->rank() == 0;
    s_->dp_rank = dist->dp->rank();
  }
  check_supported_layout(cfg, dist ? dist->world->size() : 1);
  s_->batch = batch_layout(cfg, dist ? dist->world->size() : 1);
  fs::create_directories(s_->dir);
  if (s_->leader) {
    std::ofstream out(s_->dir / "config.json", std::ios::trunc);
    out << config_to_json(cfg).dump(2) << "\n";
  }
  const std::string log_name = s_->leader ? "train.log" : fmt::format("train-rank{}.log", dist->world->rank());
  auto file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>((s_->dir / log_name).string(), false);
  std::vector<spdlog::sink_ptr> sinks{file_sink};
  if (s_->leader) sinks.insert(sinks.end(), s_->hooks.log_sinks.begin(), s_->hooks.log_sinks.end());
  s_->log = std::make_shared<spdlog::logger>("train", sinks.begin(), sinks.end());
  s_->log->set_level(spdlog::level::from_str(cfg.log_level));
  s_->log->flush_on(spdlog::level::info);

  const int threads = configure_threads(cfg.threads);
  // Dropout masks differ between data-parallel ranks, as they would between batches.
  torch::manual_seed(static_cast<uint64_t>(cfg.seed) + 1000003ull * static_cast<uint64_t>(s_->dp_rank));
  s_->data = std::make_unique<TokenDataset>(cfg.data.path);
  if (s_->data->vocab_size() > cfg.model.vocab_size)
    throw ConfigError("model.vocab_size", fmt::format("{} is smaller than the dataset's vocabulary of {} ids ({})",
                                                      cfg.model.vocab_size, s_->data->vocab_size(), cfg.data.path));
  TensorParallel tp;
  if (dist && dist->tp->size() > 1)
    tp = TensorParallel{dist->tp.get(), dist->tp->rank(), dist->tp->size(), cfg.parallel.sequence_parallel};
  const int pp = dist ? dist->pp->size() : 1;
  if (pp > 1) s_->stage = partition_stages(cfg.model, pp, cfg.data.seq_len, cfg.parallel.pipeline_stages)[static_cast<size_t>(dist->pp->rank())];
  s_->model = Transformer(cfg.model, tp, s_->stage);
  s_->model->reset_parameters(static_cast<uint64_t>(cfg.seed));
  s_->model->train();
  if (cfg.device == "cuda") {
    // Initialised on the host (the same values as a CPU run), then moved: the flat
    // buffers below are allocated where the parameters live.
    if (!torch::cuda::is_available())
      throw ConfigError("device", "cuda: no CUDA device is visible, or this LibTorch was built without CUDA");
    s_->device = torch::Device(torch::kCUDA, cuda_device_index(cfg, dist ? dist->env.local_rank : 0));
    s_->model->to(s_->device);
  }
  FlatParameters::Options layout;
  layout.unit_of = block_unit;
  if (dist) layout = DataParallel::flat_options(cfg.parallel, static_cast<int>(s_->batch.dp));
  // A parameter every tensor-parallel rank holds whole counts once in the gradient norm,
  // and the last stage's copy of tied embeddings not at all.
  layout.counted = [model = s_->model.get(), rank = tp.rank, stage = s_->stage](const std::string& name) {
    return stage_owns(stage, name) && (rank == 0 || model->tp_slice(name).dim >= 0);
  };
  s_->flat = std::make_unique<FlatParameters>(*s_->model, cfg.optimizer, layout);
  if (dist) {
    s_->data_parallel =
        std::make_unique<DataParallel>(*dist->dp, *s_->flat, cfg.parallel, std::vector<Comm*>{dist->tp.get(), dist->pp.get()});
    s_->model->set_parameter_units(s_->data_parallel->parameter_units());
    s_->optim = s_->data_parallel->make_optimizer(cfg.optimizer, cfg.parallel.offload_optimizer);
  } else {
    s_->optim = std::make_unique<AdamW>(*s_->flat, cfg.optimizer, cfg.parallel.offload_optimizer);
  }
  s_->checkpointer = std::make_unique<Checkpointer>(
      (s_->dir / "checkpoints").string(),
      CheckpointParts{&s_->cfg, s_->model.get(), s_->flat.get(), s_->optim.get(), dist});
  if (pp > 1) {
    const int64_t t = cfg.data.seq_len / (tp.sequence_parallel ? tp.size : 1);
    s_->pipeline = std::make_unique<Pipeline>(*dist->pp, s_->model, cfg.parallel.pipeline_schedule,
                                              std::vector<int64_t>{s_->batch.micro_batch, t, cfg.model.dim},
                                              cfg.precision.compute);
  }
  if (s_->leader && fs::exists(s_->data->tokenizer_path()))
    fs::copy_file(s_->data->tokenizer_path(), s_->dir / fs::path(s_->data->tokenizer_path()).filename(),
                  fs::copy_options::overwrite_existing);
  const std::string intro = fmt::format(
      "run '{}': {} parameters, {} threads, {} sequences of {} tokens per step ({} micro-batches of {}{})", cfg.name,
      parameter_count(cfg.model), threads, cfg.batch.global_batch, cfg.data.seq_len,
      accumulation_steps(cfg.batch.global_batch, s_->batch), s_->batch.micro_batch,
      dist ? fmt::format(" on each of {} ranks, {}, ZeRO-{}{}", s_->batch.dp, dist->grid.describe(), cfg.parallel.zero,
                         cfg.parallel.offload_optimizer ? " with optimizer offload" : "")
           : "");
  s_->log->info("{}", intro);
  if (s_->leader) spdlog::info("{}", intro);
  if (s_->pipeline)
    s_->log->info("pipeline stage {} of {}: blocks [{}, {}){}{}, {} schedule", dist->pp->rank(), pp,
                  s_->stage.first_block, s_->stage.end_block, s_->stage.first ? ", embeddings" : "",
                  s_->stage.last ? ", output head" : "", cfg.parallel.pipeline_schedule);
}

Trainer::~Trainer() {
  if (s_ && s_->checkpointer) s_->checkpointer->wait();
  if (s_ && s_->model) s_->model->set_parameter_units(nullptr);
}

void Trainer::save_weights(const std::string& path) {
  auto& s = *s_;
  const int pp = s.dist ? s.dist->pp->size() : 1;
  auto save = [&] {
    if (s.model->tensor_parallel().size == 1 && pp == 1) {
      if (s.leader) save_model(path, s.model);
      return;
    }
    // The slices of the tensor-parallel ranks joined, the stages' parts sent to the first
    // stage of the first replica, and one process's model written by the leader.
    Transformer whole{nullptr};
    if (s.leader) whole = Transformer(s.cfg.model);
    auto params = s.leader ? whole->named_parameters() : torch::OrderedDict<std::string, torch::Tensor>();
    const bool sender = pp > 1 && !s.leader && s.dist->dp->rank() == 0 && s.dist->tp->rank() == 0;
    std::vector<std::unique_ptr<PendingCollective>> sends;
    int tag = 0;
    s.model->for_each_whole_parameter([&](const std::string& name, const torch::Tensor& t) {
      if (!stage_owns(s.stage, name)) return;
      if (s.leader) params[name].copy_(t);
      if (sender) sends.push_back(s.dist->pp->send(t.contiguous(), 0, tag++, "weights " + name));
    });
    for (auto& w : sends) w->wait();
    if (!s.leader) return;
    if (pp > 1) {
      torch::NoGradGuard no_grad;
      const auto stages = partition_stages(s.cfg.model, pp, s.cfg.data.seq_len, s.cfg.parallel.pipeline_stages);
      for (int st = 1; st < pp; ++st) {
        int from_tag = 0;
        for (auto& item : params)
          if (stage_owns(stages[static_cast<size_t>(st)], item.key()))
            s.dist->pp->recv(item.value(), st, from_tag++, "weights " + item.key());
      }
    }
    save_model(path, whole);
  };
  if (s.data_parallel)
    s.data_parallel->with_full_parameters(save);
  else
    save();
}

TrainResult Trainer::run() {
  auto& s = *s_;
  const auto& cfg = s.cfg;
  // cfg follows live changes: the batch size, and with it these, may change per step.
  auto tokens_per_step = [&] { return cfg.batch.global_batch * cfg.data.seq_len; };
  const char* device_kind = s.device.is_cuda() ? "cuda" : "cpu";
  double peak = s.hooks.peak_flops > 0 ? s.hooks.peak_flops : measure_matmul_peak(device_kind, cfg.precision.compute);
  int reprobes_left = s.hooks.peak_flops > 0 ? 0 : 3;
  const double flops_per_token = train_flops_per_token(cfg.model, cfg.data.seq_len);
  s.log->info("matmul peak {:.1f} GFLOP/s; {:.3g} FLOPs per token", peak / 1e9, flops_per_token);

  const TokenSplit& train = s.data->split("train");
  const TokenSplit& val = s.data->split("val");
  const bool can_eval = val.size() > cfg.data.seq_len;
  TrainResult result;
  result.unigram_baseline = can_eval ? unigram_entropy(val) : 0.0;
  ResumeState resumed;
  if (!s.hooks.resume.empty()) {
    std::optional<std::string> from = s.hooks.resume;
    if (s.hooks.resume == "auto") from = s.checkpointer->latest_valid();
    if (from) {
      resumed = s.checkpointer->load(*from);
      s.log->info("resumed from {} at step {}", *from, resumed.step);
    } else {
      s.log->info("no checkpoint to resume from: starting at step 0");
    }
  }
  // Data-parallel ranks read different samples; tensor-parallel ranks and pipeline
  // stages of one replica read the same.
  const int64_t micro_batch = s.batch.micro_batch;
  BatchLoader loader(train, static_cast<uint64_t>(cfg.seed), micro_batch, cfg.data.seq_len, resumed.loader_cursor,
                     cfg.data.prefetch, s.dp_rank * micro_batch, s.batch.dp * micro_batch);
  auto next_batch = [&] {
    Batch b = loader.next();
    if (s.device.is_cuda()) {
      b.tokens = b.tokens.to(s.device, /*non_blocking=*/true);
      b.targets = b.targets.to(s.device, /*non_blocking=*/true);
    }
    return b;
  };
  std::unique_ptr<JsonlWriter> metrics;
  if (s.leader) {
    // Rows after the starting step are from an attempt that did not reach a checkpoint
    // (or from an earlier run in this directory): this run writes those steps anew.
    const auto loss = truncate_metrics((s.dir / "metrics.jsonl").string(), resumed.step);
    if (resumed.step > 0) {
      result.steps = resumed.step;
      if (loss) result.final_loss = *loss;
    }
    metrics = std::make_unique<JsonlWriter>((s.dir / "metrics.jsonl").string());
  }
  ProgressLine progress;
  double ema_step = 0;
  int64_t tokens_seen = resumed.step * tokens_per_step();
  AnomalyDetector detector(cfg.anomaly, static_cast<bool>(s.hooks.anomaly_policy));
  std::set<int64_t> inject_nan = injected_nan_steps();
  int64_t saved_step = resumed.step > 0 ? resumed.step : -1;
  std::unique_ptr<LiveControl> control;
  if (s.hooks.controlled) {
    control = std::make_unique<LiveControl>(s.dist ? s.dist->world.get() : nullptr, s.hooks.take_commands,
                                            s.hooks.on_event, s.batch);
  }
  // Every failed save is in the run log when it happens (training goes on); under a
  // daemon rank 0 also reports each save as an event.
  decltype(s.hooks.on_event) emit;
  if (s.hooks.controlled && s.leader) emit = s.hooks.on_event;
  s.checkpointer->on_finished([log = s.log, emit](int64_t step, const std::string& dir, const std::string& error) {
    if (!error.empty()) log->error("checkpoint failed: step {}: {}", step, error);
    if (!emit) return;
    if (error.empty())
      emit("checkpoint", {{"step", step}, {"path", dir}});
    else
      emit("checkpoint_failed", {{"step", step}, {"error", error}});
  });
  auto save_checkpoint = [&](int64_t steps_done) {
    const auto before = Clock::now();
    s.checkpointer->save(steps_done, s.optim->steps_taken(), loader.cursor());
    saved_step = steps_done;
    s.log->info("checkpoint: step {} held training for {:.3f} s ({})", steps_done,
                std::chrono::duration<double>(Clock::now() - before).count(),
                cfg.checkpoint.async ? "snapshot to host memory; written in the background" : "written");
  };
  const bool tied_stages = s.pipeline && cfg.model.tie_embeddings;
  auto bytes_sent = [&] {
    int64_t total = 0;
    if (s.dist)
      for (const auto* c : {s.dist->dp.get(), s.dist->tp.get(), s.dist->pp.get(), s.dist->embedding.get()})
        if (c) total += c->bytes_sent();
    return total;
  };
  // The loss lives on the last pipeline stage: every stage adds it up.
  auto stage_sum = [&](double x) {
    if (!s.pipeline) return x;
    auto t = torch::tensor({x}, torch::kFloat64);
    s.dist->pp->all_reduce_sum(t, "loss");
    return t.item<double>();
  };
  int64_t comm_before = 0;
  const int64_t flat_bytes = s.flat->numel() * static_cast<int64_t>(sizeof(float));

  for (int64_t step = resumed.step; step < cfg.schedule.steps; ++step) {
    std::vector<std::pair<std::string, std::string>> changes;
    if (control) {
      const BoundaryActions act = control->at_boundary(step, s.cfg);
      for (const LiveEffect effect : act.effects) {
        switch (effect) {
          case LiveEffect::Optimizer: s.optim->config().weight_decay = cfg.optimizer.weight_decay; break;
          case LiveEffect::LogLevel: s.log->set_level(spdlog::level::from_str(cfg.log_level)); break;
          case LiveEffect::Anomaly: detector.set_config(cfg.anomaly); break;
          case LiveEffect::None:
          case LiveEffect::EachStep:
          case LiveEffect::LrSchedule: break;  // read from cfg where they are used
        }
      }
      for (const auto& [field, value] : act.changes) s.log->info("step {}: {} set to {}", step, field, value);
      changes = act.changes;
      if ((act.checkpoint || act.stop) && saved_step != step) save_checkpoint(step);
      if (act.stop) {
        s.log->info("stopped at step {} by request", step);
        progress.finish();
        s.checkpointer->wait();
        result.stopped = true;
        result.steps = step;
        return result;
      }
    }
    const int64_t accum = accumulation_steps(cfg.batch.global_batch, s.batch);
    const auto t0 = Clock::now();
    const double lr = cfg.optimizer.lr_scale *
                      (s.hooks.lr ? s.hooks.lr(step) : scheduled_lr(cfg.schedule, cfg.optimizer.lr, step));
    if (s.data_parallel)
      s.data_parallel->zero_grad();
    else
      s.flat->zero_grad();
    double loss_sum = 0;
    if (s.pipeline) {
      std::vector<Batch> batches;
      for (int64_t micro = 0; micro < accum; ++micro) batches.push_back(next_batch());
      // Tied embeddings: the two stages' gradients are summed after backward, so no
      // reduction may start during it.
      loss_sum = stage_sum(s.pipeline->train(batches, 1.0 / static_cast<double>(accum), [&](int64_t micro) {
        s.data_parallel->begin_backward(!tied_stages && micro + 1 == accum);
      }));
      if (tied_stages && s.dist->embedding) {
        auto g = s.model->tok_embeddings.grad();
        s.dist->embedding->all_reduce_sum(g, "tied embedding gradients");
      }
    } else {
      for (int64_t micro = 0; micro < accum; ++micro) {
        const Batch b = next_batch();
        auto loss = with_compute_dtype(cfg.precision.compute, [&] { return s.model->loss(b.tokens, b.targets); });
        if (micro == 0 && inject_nan.erase(step + 1)) {
          s.log->warn("step {}: injecting a NaN loss (TIDE_INJECT_NAN_AT)", step + 1);
          loss = loss * std::numeric_limits<double>::quiet_NaN();
        }
        if (s.data_parallel) s.data_parallel->begin_backward(micro + 1 == accum);
        (loss / static_cast<double>(accum)).backward();
        loss_sum += loss.item<double>();
      }
    }
    // Every rank gets the same global norm, so clipping and the skip decision agree.
    double gnorm;
    if (s.data_parallel) {
      loss_sum = s.data_parallel->sum(loss_sum) / static_cast<double>(s.batch.dp);
      gnorm = s.data_parallel->reduce_gradients();
      if (const double f = clip_factor(gnorm, cfg.optimizer.grad_clip); f != 1.0) s.data_parallel->scale_gradients(f);
    } else {
      gnorm = clip_grad_norm(s.flat->grad(), cfg.optimizer.grad_clip);
    }
    StepMetrics m;
    // Every rank holds the same reduced loss and norm: the same verdict everywhere.
    Anomaly anomaly = detector.check(loss_sum / static_cast<double>(accum), gnorm);
    std::string decided_by = "recipe";
    double lr_factor = cfg.anomaly.lr_factor;
    if (anomaly && s.hooks.anomaly_policy) {
      if (const auto decision = decide_anomaly(s.hooks.anomaly_policy, s.dist ? s.dist->world.get() : nullptr, step + 1,
                                                 anomaly, *s.log)) {
        anomaly.action = decision->action;
        lr_factor = decision->lr_factor.value_or(lr_factor);
        decided_by = "on_anomaly";
      }
    }
    m.skipped = !std::isfinite(gnorm) || (anomaly && anomaly.action != AnomalyAction::None);
    if (anomaly) {
      m.anomaly = anomaly.kind;
      m.anomaly_action = anomaly_action_name(anomaly.action);
      if (anomaly.action == AnomalyAction::ScaleLr) s.cfg.optimizer.lr_scale *= lr_factor;
    }
    if (!m.skipped) {
      s.optim->step(lr);
      if (s.data_parallel) s.data_parallel->gather_parameters();
    }
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    ema_step = step == 0 ? dt : 0.9 * ema_step + 0.1 * dt;

    m.step = step + 1;
    m.total_steps = cfg.schedule.steps;
    m.loss = loss_sum / static_cast<double>(accum);
    m.grad_norm = gnorm;
    m.lr = lr;
    tokens_seen += tokens_per_step();
    m.tokens_seen = tokens_seen;
    m.step_seconds = dt;
    m.tokens_per_second = static_cast<double>(tokens_per_step()) / dt;
    m.changes = std::move(changes);
    // Every rank measured the peak of its own share of the machine.
    const int world = s.dist ? s.dist->world->size() : 1;
    m.mfu = m.tokens_per_second * flops_per_token / (peak * world);
    if (m.mfu > 1.0 && reprobes_left > 0) {
      // The model ran faster than the probe did: the machine was busy when it probed.
      --reprobes_left;
      peak = std::max(peak, measure_matmul_peak(device_kind, cfg.precision.compute));
      s.log->info("matmul peak re-measured: {:.1f} GFLOP/s", peak / 1e9);
      m.mfu = m.tokens_per_second * flops_per_token / (peak * world);
    }
    const auto mem = read_memory();
    m.rss_mb = mem.rss_mb;
    m.peak_rss_mb = mem.peak_rss_mb;
    m.peak_gpu_mb = peak_device_mb(s.device);
    m.param_bytes = s.data_parallel ? s.data_parallel->param_bytes() : flat_bytes;
    m.grad_bytes = s.data_parallel ? s.data_parallel->grad_bytes() : flat_bytes;
    m.optimizer_bytes = s.optim->state_bytes();
    if (s.data_parallel) {
      m.transient_bytes = s.data_parallel->peak_transient_bytes();
      m.comm_bytes = bytes_sent() - comm_before;
      comm_before = bytes_sent();
    }
    m.eta_seconds = ema_step * static_cast<double>(cfg.schedule.steps - step - 1);
    const bool last = step + 1 == cfg.schedule.steps;
    // eval.every = 0 means never, the last step included.
    if (can_eval && cfg.eval.every > 0 && ((step + 1) % cfg.eval.every == 0 || last)) {
      double total = 0;
      if (s.pipeline) {
        s.model->eval();
        total = stage_sum(sum_eval_losses([&](const Batch& b) { return s.pipeline->forward_loss(b); }, val,
                                            cfg.data.seq_len, micro_batch, cfg.eval.batches, s.dp_rank, s.batch.dp));
        s.model->train();
      } else {
        total = evaluate_loss_sum(s.model, val, cfg.data.seq_len, micro_batch, cfg.eval.batches, s.dp_rank,
                                  s.batch.dp);
      }
      if (s.data_parallel) total = s.data_parallel->sum(total);
      m.val_loss = total / static_cast<double>(cfg.eval.batches);
      result.final_val_loss = m.val_loss;
    }
    if (metrics) metrics->write(to_json(m));
    if (s.leader && s.hooks.show_progress && ((step + 1) % cfg.log_every == 0 || last || m.val_loss))
      progress.update(m);
    if ((step + 1) % cfg.log_every == 0 || last || m.val_loss) s.log->info("{}", ProgressLine::format(m));
    if (m.skipped && !anomaly) s.log->warn("step {}: non-finite gradient norm, update skipped", m.step);
    if (s.hooks.on_step) s.hooks.on_step(m);
    if (anomaly) {
      nlohmann::json event = {{"step", m.step},        {"kind", anomaly.kind},
                              {"value", anomaly.value}, {"score", anomaly.score},
                              {"action", m.anomaly_action}, {"by", decided_by}};
      if (anomaly.action == AnomalyAction::ScaleLr) event["lr_factor"] = lr_factor;
      if (!std::isfinite(anomaly.value)) event["value"] = nullptr;
      std::optional<std::string> from;
      if (anomaly.action == AnomalyAction::Rollback) {
        s.checkpointer->wait();
        from = s.checkpointer->latest_valid();
        if (!from) event["action"] = "skip";  // nothing to roll back to
      }
      s.log->warn("step {}: {} (value {}, score {:.1f}): {}", m.step, anomaly.kind, anomaly.value, anomaly.score,
                  event["action"].get<std::string>());
      if (from) {
        const ResumeState back = s.checkpointer->load(*from);
        event["to_step"] = back.step;
        s.log->warn("rolled back to {} (step {}); the data goes on from where it was", *from, back.step);
      }
      if (s.leader && s.hooks.on_event) s.hooks.on_event("anomaly", event);
      if (from) {
        const int64_t back_step = event["to_step"].get<int64_t>();
        tokens_seen = back_step * tokens_per_step();
        saved_step = back_step;
        step = back_step - 1;  // the loop's ++ continues at the checkpoint's step
        continue;
      }
      if (anomaly.action == AnomalyAction::Stop) {
        if (s.leader && s.hooks.on_event) s.hooks.on_event("stopping", {{"step", m.step}, {"reason", anomaly.kind}});
        progress.finish();
        s.checkpointer->wait();
        result.stopped = true;
        result.steps = m.step;
        result.final_loss = m.loss;
        return result;
      }
    }
    if ((cfg.checkpoint.every > 0 && (step + 1) % cfg.checkpoint.every == 0) || last) save_checkpoint(step + 1);
    result.steps = m.step;
    result.final_loss = m.loss;
  }
  progress.finish();
  s.checkpointer->wait();
  result.weights_path = (s.dir / "model.safetensors").string();
  save_weights(result.weights_path);
  if (!s.leader) return result;
  nlohmann::json summary = {{"steps", result.steps},
                            {"final_loss", result.final_loss},
                            {"unigram_baseline", result.unigram_baseline},
                            {"weights", "model.safetensors"}};
  if (result.final_val_loss) summary["final_val_loss"] = *result.final_val_loss;
  std::ofstream(s.dir / "summary.json", std::ios::trunc) << summary.dump(2) << "\n";
  s.log->info("done: {}", summary.dump());
  return result;
}

}  // namespace tide
