#include "training_loop.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>
#include <stdexcept>

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>

#include "final_weights.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/data/training_data.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/lr_schedule.h"
#include "tide/engine/parallel/comm.h"
#include "tide/engine/parallel/data_parallel.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/train/evaluate.h"
#include "tide/engine/train/initial_weights.h"
#include "tide/engine/train/run_files.h"

namespace tide {
namespace {
using json = nlohmann::json;

// eval.every = 0 means never, the last step included.
bool evaluation_due(const EvalConfig& e, int64_t steps_done, bool last) {
  return e.every > 0 && (steps_done % e.every == 0 || last);
}
bool checkpoint_due(const CheckpointConfig& c, int64_t steps_done, bool last) {
  return (c.every > 0 && steps_done % c.every == 0) || last;
}

std::optional<std::string> why_uncaptured(const Trainer::State& s) {
  StepCaptureFacts facts;
  facts.cuda_build = step_graphs_built();
  facts.distributed = s.dist || s.pm.data_parallel || s.pm.pipeline;
  facts.loss_tap = static_cast<bool>(s.hooks.loss_tap);
  facts.anomaly_policy = static_cast<bool>(s.hooks.anomaly_policy);
  facts.optimizer_on_device = s.pm.optim->runs_on_device();
  return why_steps_run_uncaptured(s.cfg, facts);
}
}  // namespace

TrainingLoop::TrainingLoop(Trainer::State& s)
    : s_(s),
      cfg_(s.cfg),
      scheduled_lr_(s.hooks.lr
                        ? s.hooks.lr
                        : [&cfg = s.cfg](int64_t step) { return scheduled_lr(cfg.schedule, cfg.optimizer.lr, step); }),
      step_(s.pm, s.dist, s.cfg, s.batch, s.dp_rank, s.hooks.loss_tap),
      meter_(s.cfg, s.pm, s.dist, s.device, s.hooks.peak_flops, *s.log),
      judge_(s.cfg.anomaly, s.hooks.anomaly_policy, s.dist ? s.dist->control() : nullptr, *s.log,
             s.cfg.precision.compute == DType::Float16),
      graphs_(s.device, why_uncaptured(s), *s.log),
      profiler_(s.cfg, s.dist ? s.dist->world->rank() : 0, s.device, s.dir, s.log) {
  if (s.hooks.controlled)
    control_ = std::make_unique<LiveControl>(s.dist ? s.dist->control() : nullptr, s.hooks.take_commands,
                                             s.hooks.on_event, s.batch);
  double evaluable_share = 0;
  for (size_t i = 0; i < s.data->size(); ++i)
    if (s.data->dataset(i).split("val").size() > cfg_.data.seq_len) {
      evaluable_.emplace_back(i, s.data->share(i));
      evaluable_share += s.data->share(i);
    }
  for (auto& [i, share] : evaluable_) {
    share /= evaluable_share;
    result_.unigram_baseline += share * unigram_entropy(s.data->dataset(i).split("val"));
  }
  resume();
  // Data-parallel ranks read different samples; tensor-parallel ranks and pipeline
  // stages of one replica read the same.
  const int64_t micro = s.batch.micro_batch;
  loader_ = std::make_unique<BatchLoader>(
      s.data->train_samples(static_cast<uint64_t>(cfg_.seed), cfg_.data.document_windows), micro, cfg_.data.seq_len,
      resumed_.loader_cursor, cfg_.data.prefetch, s.dp_rank * micro, s.batch.dp * micro,
      /*pin=*/s.device.is_cuda(), BatchContents::of(cfg_.data));
  open_metrics();
  tokens_seen_ = resumed_.step * tokens_per_step();
  shown_tokens_seen_ = tokens_seen_;
  saved_step_ = resumed_.step > 0 ? resumed_.step : -1;
  watch_checkpoints();
}

void TrainingLoop::resume() {
  std::optional<std::string> from;
  if (!s_.hooks.resume.empty()) {
    from = s_.hooks.resume == "auto" ? s_.checkpointer->latest_valid() : s_.hooks.resume;
    if (!from) s_.log->info("no checkpoint to resume from: starting at step 0");
  }
  if (!from) {
    // A checkpoint holds what the run made of its initial weights: only a fresh start
    // reads them.
    if (!s_.cfg.checkpoint.init_from.empty())
      load_initial_weights(s_.cfg.checkpoint.init_from, s_.cfg.model, *s_.checkpointer);
    return;
  }
  // A LoRA checkpoint holds the adapters alone: the frozen base comes from the initial
  // weights (or, without any, the seed's draw already in place).
  if (s_.cfg.model.lora_rank > 0 && !s_.cfg.checkpoint.init_from.empty())
    load_initial_weights(s_.cfg.checkpoint.init_from, s_.cfg.model, *s_.checkpointer);
  resumed_ = s_.checkpointer->load(*from);
  restore_loss_scale(resumed_);
  s_.log->info("resumed from {} at step {}", *from, resumed_.step);
}

void TrainingLoop::open_metrics() {
  if (!s_.leader) return;
  // Rows after the starting step are from an attempt that did not reach a checkpoint
  // (or from an earlier run in this directory): this run writes those steps anew.
  const std::string path = (s_.dir / "metrics.jsonl").string();
  const auto loss = truncate_step_rows(path, resumed_.step);
  if (resumed_.step > 0) {
    result_.steps = resumed_.step;
    if (loss) result_.final_loss = *loss;
  }
  metrics_ = std::make_unique<JsonlWriter>(path);
  tensorboard_ = std::make_unique<TensorBoardLog>((s_.dir / "tb").string(), resumed_.step);
}

void TrainingLoop::watch_checkpoints() {
  // Every failed save is in the run log when it happens (training goes on); under a
  // daemon rank 0 also reports each save as an event.
  decltype(s_.hooks.on_event) emit;
  if (s_.hooks.controlled && s_.leader) emit = s_.hooks.on_event;
  s_.checkpointer->on_finished(
      [log = s_.log, emit](int64_t step, const std::string& dir, const std::string& error, double seconds) {
        if (!error.empty()) log->error("checkpoint failed: step {}: {}", step, error);
        if (!emit) return;
        if (error.empty())
          emit("checkpoint", {{"step", step}, {"path", dir}, {"seconds", seconds}});
        else
          emit("checkpoint_failed", {{"step", step}, {"error", error}, {"seconds", seconds}});
      });
}

std::vector<Batch> TrainingLoop::next_batches(int64_t n) {
  const auto began = std::chrono::steady_clock::now();
  std::vector<Batch> out;
  for (int64_t i = 0; i < n; ++i) {
    Batch b = loader_->next();
    if (s_.device.is_cuda()) {
      b.tokens = b.tokens.to(s_.device, /*non_blocking=*/true);
      b.targets = b.targets.to(s_.device, /*non_blocking=*/true);
      if (b.documents.defined()) b.documents = b.documents.to(s_.device, /*non_blocking=*/true);
    }
    out.push_back(std::move(b));
  }
  meter_.add_data_seconds(std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count());
  return out;
}

TrainResult TrainingLoop::run() {
  for (int64_t step = resumed_.step; step < cfg_.schedule.steps; ++step) {
    Changes changes;
    if (control_ && at_boundary(step, changes)) return stopped(step);
    const int64_t this_step = step;
    profiler_.begin_step(this_step);
    // rolled_back: `step` is the one before the checkpoint's, where the loop goes on
    const Next next = run_step(step, changes);
    profiler_.end_step(this_step);
    if (next == Next::stop) return stopped(result_.steps);
  }
  return finish();
}

bool TrainingLoop::at_boundary(int64_t& step, Changes& changes) {
  // Commands see the run as it stands at the boundary: the step before is settled first
  // (commands are rare, so this costs nothing in the steps between).
  Next settled = Next::step;
  const auto settle_step_before = [&] {
    if (pending_) settled = settle(step, /*step_end=*/false);
  };
  const BoundaryActions act = control_->at_boundary(step, s_.cfg, settle_step_before);
  if (settled == Next::stop) return true;
  if (settled == Next::rolled_back) ++step;  // the checkpoint's step, saved already
  apply(act.effects);
  for (const auto& [field, value] : act.changes) s_.log->info("step {}: {} set to {}", step, field, value);
  changes = act.changes;
  // The captured update holds the settings it was captured with (clipping, weight decay,
  // the anomaly actions): a change is captured anew.
  if (!changes.empty()) graphs_.reset("a setting changed");
  if ((act.checkpoint || act.stop) && saved_step_ != step) save_checkpoint(step);
  if (act.stop) s_.log->info("stopped at step {} by request", step);
  return act.stop;
}

TrainingLoop::Next TrainingLoop::run_step(int64_t& step, const Changes& changes) {
  meter_.start_step();
  std::vector<Batch> batches =
      carried_.empty() ? next_batches(accumulation_steps(cfg_.batch.global_batch, s_.batch)) : std::move(carried_);
  carried_.clear();
  const StepValues values = graphs_.forward_backward(batches, [&](const std::vector<Batch>& in) {
    RECORD_USER_SCOPE("tide::forward_backward");
    return step_.forward_backward(step, in);
  });
  if (pending_) {
    // The step before, read while this one's work runs on the device. A rollback discards
    // this step's gradients; its batches are the next step's, as the data goes on.
    const Next next = settle(step, /*step_end=*/false);
    if (next == Next::rolled_back) carried_ = std::move(batches);
    if (next != Next::step) return next;
  }
  // After the step before was judged: its scale_lr applies to this update.
  const double lr = cfg_.optimizer.lr_scale * scheduled_lr_(step);
  // What the update reads on the host goes to the device first: a captured update
  // replays with it.
  judge_.begin_step(s_.device);
  step_.set_lr(lr);
  // The update, skipped where `flagged` says or the norm is not finite; its skip flag.
  const auto update = [&](const at::Tensor& flagged) {
    RECORD_USER_SCOPE("tide::update");
    const UpdateGate gate = gate_update(values.grad_norm, cfg_.optimizer.grad_clip, flagged);
    step_.update(gate, values.grad_norm);
    return gate.skip;
  };
  std::optional<AnomalyJudge::Verdict> verdict;
  at::Tensor skip;
  if (judge_.judges_on_device()) {
    skip = graphs_.update([&] { return update(judge_.skip_on_device(values.loss, values.grad_norm)); });
  } else {
    verdict = judge_.judge(step + 1, values.loss.item<double>(), values.grad_norm.item<double>());
    const bool act = verdict->anomaly && verdict->anomaly.action != AnomalyAction::None;
    skip = update(torch::full({}, act, values.grad_norm.options().dtype(torch::kBool)));
  }
  pending_.emplace(PendingStep{step, StepReadout(values, skip), std::move(verdict), lr, meter_.end_step(),
                               tokens_per_step(), changes});
  return step_end_has_work(step) ? settle(step, /*step_end=*/true) : Next::step;
}

bool TrainingLoop::step_end_has_work(int64_t step) const {
  const int64_t done = step + 1;
  const bool last = done == cfg_.schedule.steps;
  return !judge_.judges_on_device() || last || (!evaluable_.empty() && evaluation_due(cfg_.eval, done, last)) ||
         checkpoint_due(cfg_.checkpoint, done, last);
}

void TrainingLoop::validate(StepMetrics& m) {
  double mean = 0;
  for (const auto& [i, share] : evaluable_) {
    const double loss = step_.validation_loss(s_.data->dataset(i).split("val"), cfg_.eval.batches);
    mean += share * loss;
    if (s_.data->size() > 1) m.val_losses.emplace_back(s_.data->name(i), loss);
  }
  result_.final_val_loss = m.val_loss = mean;
}

TrainingLoop::Next TrainingLoop::settle(int64_t& step, bool step_end) {
  const PendingStep p = std::move(*pending_);
  pending_.reset();
  const StepLoss loss = p.readout.read();
  const AnomalyJudge::Verdict verdict = p.verdict ? *p.verdict : judge_.judge(p.step + 1, loss.loss, loss.grad_norm);
  const Anomaly& anomaly = verdict.anomaly;
  // The device skipped by the same comparisons on the same values (AnomalyJudge).
  const bool skip = !std::isfinite(loss.grad_norm) || (anomaly && anomaly.action != AnomalyAction::None);
  if (skip != loss.skipped)
    throw std::logic_error(fmt::format("step {}: the device {} the update but the host judged {} (anomaly '{}')",
                                       p.step + 1, loss.skipped ? "skipped" : "applied", skip ? "skip" : "apply",
                                       anomaly.kind));
  StepMetrics m;
  m.changes = p.changes;
  m.skipped = loss.skipped;
  if (anomaly) {
    m.anomaly = anomaly.kind;
    m.anomaly_action = anomaly_action_name(anomaly.action);
    if (anomaly.action == AnomalyAction::ScaleLr) s_.cfg.optimizer.lr_scale *= verdict.lr_factor;
  }
  measure(m, p, loss);
  if (step_end && !evaluable_.empty() && evaluation_due(cfg_.eval, m.step, m.step == cfg_.schedule.steps)) validate(m);
  report(m, static_cast<bool>(anomaly));
  if (anomaly) {
    int64_t at = p.step;
    const Next next = respond(verdict, m, at);
    if (next == Next::rolled_back) {
      step = at;
      return next;
    }
    if (next == Next::stop) {
      result_.steps = m.step;
      result_.final_loss = m.loss;
      return next;
    }
  }
  if (step_end && checkpoint_due(cfg_.checkpoint, m.step, m.step == cfg_.schedule.steps)) save_checkpoint(m.step);
  result_.steps = m.step;
  result_.final_loss = m.loss;
  return Next::step;
}

void TrainingLoop::apply(const std::vector<LiveEffect>& effects) {
  for (const LiveEffect effect : effects) {
    switch (effect) {
      case LiveEffect::Optimizer:
        s_.pm.optim->config().weight_decay = cfg_.optimizer.weight_decay;
        if (s_.pm.expert_optim) s_.pm.expert_optim->config().weight_decay = cfg_.optimizer.weight_decay;
        break;
      case LiveEffect::LogLevel: s_.log->set_level(spdlog::level::from_str(cfg_.log_level)); break;
      case LiveEffect::Anomaly: judge_.set_config(cfg_.anomaly); break;
      case LiveEffect::None:
      case LiveEffect::EachStep:
      case LiveEffect::LrSchedule: break;  // read from the configuration where they are used
    }
  }
}

void TrainingLoop::measure(StepMetrics& m, const PendingStep& p, const StepLoss& loss) {
  meter_.finish_step(m, p.tokens, cfg_.schedule.steps - p.step - 1, p.cost);
  m.step = p.step + 1;
  m.total_steps = cfg_.schedule.steps;
  m.loss = loss.loss;
  m.grad_norm = loss.grad_norm;
  m.loss_scale = loss.loss_scale;
  m.moe_balance = loss.moe_balance;
  m.moe_max_load = loss.moe_max_load;
  m.moe_z = loss.moe_z;
  m.moe_dropped = loss.moe_dropped;
  m.lr = p.lr;
  tokens_seen_ += p.tokens;
  m.tokens_seen = tokens_seen_;
}

void TrainingLoop::report(const StepMetrics& m, bool anomaly) {
  if (metrics_) metrics_->write(to_json(m));
  if (tensorboard_) tensorboard_->write(m);
  const bool due = m.step % cfg_.log_every == 0 || m.step == cfg_.schedule.steps || m.val_loss;
  unshown_seconds_ += m.step_seconds;
  if (due) {
    StepMetrics shown = m;
    const auto tokens = static_cast<double>(m.tokens_seen - shown_tokens_seen_);
    if (tokens > 0 && unshown_seconds_ > 0 && m.tokens_per_second > 0) {
      shown.tokens_per_second = tokens / unshown_seconds_;
      shown.mfu = m.mfu * shown.tokens_per_second / m.tokens_per_second;
    }
    shown_tokens_seen_ = m.tokens_seen;
    unshown_seconds_ = 0;
    if (s_.leader && s_.hooks.show_progress) progress_.update(shown);
    s_.log->info("{}", ProgressLine::format(shown));
  }
  if (m.skipped && !anomaly) {
    if (m.loss_scale > 0)
      s_.log->info("step {}: the gradients overflowed fp16 at loss scale {:g}; update skipped, scale halved", m.step,
                   m.loss_scale);
    else
      s_.log->warn("step {}: non-finite gradient norm, update skipped", m.step);
  }
  if (s_.hooks.on_step) s_.hooks.on_step(m);
}

TrainingLoop::Next TrainingLoop::respond(const AnomalyJudge::Verdict& v, const StepMetrics& m, int64_t& step) {
  const Anomaly& anomaly = v.anomaly;
  json event = {{"step", m.step},         {"kind", anomaly.kind},       {"value", anomaly.value},
                {"score", anomaly.score}, {"action", m.anomaly_action}, {"by", v.decided_by}};
  if (anomaly.action == AnomalyAction::ScaleLr) event["lr_factor"] = v.lr_factor;
  if (!std::isfinite(anomaly.value)) event["value"] = nullptr;
  std::optional<std::string> from;
  if (anomaly.action == AnomalyAction::Rollback) {
    // Rank 0 chooses for all: its wait ends once the save in flight is committed, while
    // another rank's ends when its own shards are written, and it could read the older
    // checkpoint as the newest (ranks rolled back to different steps, then hung).
    s_.checkpointer->wait();
    std::string chosen = s_.leader ? s_.checkpointer->latest_valid().value_or("") : "";
    if (Comm* control = s_.dist ? s_.dist->control() : nullptr)
      chosen = control->broadcast_text(chosen, 0, "rollback checkpoint");
    if (!chosen.empty()) from = chosen;
    if (!from) event["action"] = "skip";  // nothing to roll back to
  }
  s_.log->warn("step {}: {} (value {}, score {:.1f}): {}", m.step, anomaly.kind, anomaly.value, anomaly.score,
               event["action"].get<std::string>());
  if (from) {
    const ResumeState back = s_.checkpointer->load(*from);
    restore_loss_scale(back);
    graphs_.reset("rolled back to a checkpoint");
    event["to_step"] = back.step;
    s_.log->warn("rolled back to {} (step {}); the data goes on from where it was", *from, back.step);
  }
  const bool emit = s_.leader && s_.hooks.on_event;
  if (emit) s_.hooks.on_event("anomaly", event);
  if (from) {
    const int64_t back_step = event["to_step"].get<int64_t>();
    tokens_seen_ = shown_tokens_seen_ = back_step * tokens_per_step();
    unshown_seconds_ = 0;
    saved_step_ = back_step;
    step = back_step - 1;  // the loop's ++ continues at the checkpoint's step
    return Next::rolled_back;
  }
  if (anomaly.action != AnomalyAction::Stop) return Next::step;
  if (emit) s_.hooks.on_event("stopping", {{"step", m.step}, {"reason", anomaly.kind}});
  return Next::stop;
}

void TrainingLoop::restore_loss_scale(const ResumeState& state) {
  LossScaler& scaler = step_.loss_scaler();
  if (!scaler.active()) return;
  // A checkpoint of a run that was not fp16 starts the scale afresh.
  if (state.loss_scale) scaler.restore(state.loss_scale->scale, state.loss_scale->good_steps);
}

void TrainingLoop::save_checkpoint(int64_t steps_done) {
  const auto before = std::chrono::steady_clock::now();
  std::optional<LossScaleState> loss_scale;
  if (const LossScaler& scaler = step_.loss_scaler(); scaler.active())
    loss_scale = LossScaleState{scaler.value(), scaler.good_steps()};
  s_.checkpointer->save(steps_done, s_.pm.optim->steps_taken(), loader_->cursor(), loss_scale);
  saved_step_ = steps_done;
  const double held = std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  meter_.add_checkpoint_seconds(held);
  s_.log->info("checkpoint: step {} held training for {:.3f} s ({})", steps_done, held,
               cfg_.checkpoint.async ? "snapshot to host memory; written in the background" : "written");
}

TrainResult TrainingLoop::stopped(int64_t steps) {
  progress_.finish();
  profiler_.finish();
  s_.checkpointer->wait();
  result_.replayed_steps = graphs_.replayed_steps();
  result_.stopped = true;
  result_.steps = steps;
  return result_;
}

TrainResult TrainingLoop::finish() {
  progress_.finish();
  profiler_.finish();
  s_.checkpointer->wait();
  result_.replayed_steps = graphs_.replayed_steps();
  result_.weights_path = (s_.dir / "model.safetensors").string();
  const int64_t extra = save_final_weights(result_.weights_path, cfg_, s_.pm, s_.dist, s_.device);
  s_.log->info(
      "final weights saved: at most {} host tensor bytes ({:.1f} MiB) held beyond the model state while saving", extra,
      static_cast<double>(extra) / (1 << 20));
  // Beside the merged weights, LoRA's adapters alone, as PEFT loads them onto the base.
  if (cfg_.model.lora_rank > 0) save_final_adapter((s_.dir / "adapter").string(), cfg_, s_.pm, s_.dist, s_.device);
  if (!s_.leader) return result_;
  json summary = {{"steps", result_.steps},
                  {"final_loss", result_.final_loss},
                  {"unigram_baseline", result_.unigram_baseline},
                  {"replayed_steps", result_.replayed_steps},
                  {"weights", "model.safetensors"}};
  if (cfg_.model.lora_rank > 0) {
    summary["adapter"] = "adapter";
    s_.log->info("LoRA adapter (PEFT's format): {}", (s_.dir / "adapter").string());
  }
  if (result_.final_val_loss) summary["final_val_loss"] = *result_.final_val_loss;
  std::ofstream(s_.dir / "summary.json", std::ios::trunc) << summary.dump(2) << "\n";
  s_.log->info("done: {}", summary.dump());
  return result_;
}

}  // namespace tide
