#include "train_step.h"

#include <algorithm>

#include <torch/types.h>

#include "tide/engine/data/token_dataset.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/linear_cross_entropy.h"
#include "tide/engine/model/micro_batch_losses.h"
#include "tide/engine/model/pipeline_stage.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/parallel/comm.h"
#include "tide/engine/parallel/data_parallel.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/parallel/pipeline.h"
#include "tide/engine/train/evaluate.h"

namespace tide {

TrainStep::TrainStep(ParallelModel& pm, Distributed* dist, const RunConfig& cfg, const BatchLayout& batch,
                     int64_t dp_rank, LossTap tap)
    : pm_(pm),
      dist_(dist),
      cfg_(cfg),
      tap_(tap ? std::move(tap) : [](int64_t, int64_t, const at::Tensor& loss) { return loss; }),
      batch_(batch),
      dp_rank_(dp_rank),
      scaler_(cfg.precision, cfg.precision.compute, pm.optim->params().device()) {
  const PipelineStage& stage = pm.model->pipeline_stage();
  const bool tied_across_stages = pm.pipeline && cfg.model.tie_embeddings;  // a pipeline has pp > 1
  for (int chunk = 0; chunk < static_cast<int>(stage.chunks.size()); ++chunk) {
    auto units = chunk_units(stage, chunk, parameter_unit_layout(cfg.model));
    if (tied_across_stages) units.erase(std::remove(units.begin(), units.end(), 0), units.end());
    backward_units_.push_back(std::move(units));
  }
}

StepValues TrainStep::forward_backward(int64_t step, const std::vector<Batch>& batches) {
  const auto accum = static_cast<int64_t>(batches.size());
  auto* dp = pm_.data_parallel.get();
  if (dp)
    dp->zero_grad();
  else
    pm_.flat->zero_grad();
  // A chunk's last pass is the step's last micro-batch's, whatever the schedule.
  const auto before_backward = [&](int64_t micro, int chunk) {
    if (dp) dp->begin_backward(micro + 1 == accum, backward_units_.at(static_cast<size_t>(chunk)));
  };
  const auto on_loss = [&](int64_t micro, at::Tensor loss) { return tap_(step, micro, loss); };
  MicroBatchLosses losses = shares_of(batches);
  // The weights stand still until the optimizer step: their bf16 copies, kept for the
  // step, serve every micro-batch's forward and backward (one cast per weight a step, for
  // 2 bytes a parameter held through it). ZeRO-3 gathers and frees the weights unit by
  // unit: no step-long copies there; each layer casts in forward and again in backward.
  const WeightCastScope working_copy(cfg_.parallel.zero != 3);
  StepValues out;
  at::Tensor moe_loads;  // [n_layers, E]: each expert's (token, choice) pairs this step
  if (scaler_.active()) out.loss_scale = scaler_.scale().clone();  // the update moves it in place
  at::Tensor loss = pm_.pipeline ? pm_.pipeline->train(batches, losses, out.loss_scale, before_backward, on_loss)
                                 : whole_model(batches, losses, out.loss_scale, before_backward, on_loss);
  loss = across_stages(loss);
  if (cfg_.model.moe_experts > 0) moe_loads = sum_moe_statistics(out, accum, loss.options());
  // Every rank gets the same global norm, so clipping and the skip decision agree.
  if (dp) {
    loss = dp->sum(loss) / static_cast<double>(batch_.replicas());
    out.grad_norm = dp->reduce_gradients();
  } else {
    torch::NoGradGuard no_grad;
    out.grad_norm = pm_.flat->grad().norm().to(torch::kFloat64);
  }
  if (moe_loads.defined()) {
    torch::NoGradGuard no_grad;
    if (cfg_.model.moe_expert_bias) moe_loads_ = moe_loads;  // update() moves the biases by them
    out.moe_max_load = (std::get<0>(moe_loads.max(1)) / moe_loads.mean(1).clamp_min(1e-30)).max();
  }
  out.loss = loss;
  if (scaler_.active()) out.grad_norm = out.grad_norm / out.loss_scale.to(torch::kFloat64);
  return out;
}

void TrainStep::set_lr(double lr) {
  torch::NoGradGuard no_grad;
  if (!lr_.defined()) lr_ = torch::empty({}, pm_.optim->params().options().dtype(torch::kFloat64));
  lr_.fill_(lr);
}

void TrainStep::update(const UpdateGate& gate, const at::Tensor& grad_norm) {
  TORCH_CHECK(lr_.defined(), "TrainStep: update before set_lr");
  if (!scaler_.active()) {
    pm_.optim->step(lr_, gate);
    if (pm_.expert_optim) pm_.expert_optim->step(lr_, gate);
  } else {
    // The gradients are the loss scale times the true ones: the clip factor divides it out.
    torch::NoGradGuard no_grad;
    UpdateGate unscaled = gate;
    const auto inverse = scaler_.scale().to(torch::kFloat64).reciprocal();
    unscaled.clip = gate.clip.defined() ? gate.clip * inverse : inverse;
    pm_.optim->step(lr_, unscaled);
    if (pm_.expert_optim) pm_.expert_optim->step(lr_, unscaled);
    scaler_.update(grad_norm);
  }
  // The routing biases move with the weights, and stand still where the step is skipped.
  if (moe_loads_.defined() && cfg_.model.moe_bias_update_rate > 0)
    pm_.model->balance_expert_biases(moe_loads_, cfg_.model.moe_bias_update_rate, gate.skip);
  moe_loads_ = at::Tensor();
  if (pm_.data_parallel) pm_.data_parallel->gather_parameters();
}

MicroBatchLosses TrainStep::shares_of(const std::vector<Batch>& batches) const {
  const auto n = static_cast<int64_t>(batches.size());
  if (!BatchContents::of(cfg_.data).uncounts_targets()) return MicroBatchLosses(n);
  // Counted on the targets' device, summed over the data-parallel (and context-parallel)
  // ranks there: no host read, and a captured step (CUDA graphs) counts each replay's
  // batches afresh. Each rank counts the targets its loss is the mean of.
  std::vector<at::Tensor> counts;
  counts.reserve(batches.size());
  for (const Batch& b : batches) counts.push_back(pm_.model->loss_targets(b.targets).ne(kUncountedTarget).sum());
  const auto counted = at::stack(counts);
  auto step_counted = counted.sum();
  if (pm_.data_parallel) step_counted = pm_.data_parallel->sum(step_counted);
  return MicroBatchLosses(counted, step_counted, batch_.replicas());
}

at::Tensor TrainStep::whole_model(const std::vector<Batch>& batches, MicroBatchLosses& losses,
                                  const at::Tensor& loss_scale,
                                  const std::function<void(int64_t, int)>& before_backward,
                                  const std::function<at::Tensor(int64_t, at::Tensor)>& on_loss) {
  for (size_t micro = 0; micro < batches.size(); ++micro) {
    const Batch& b = batches[micro];
    const auto m = static_cast<int64_t>(micro);
    auto loss =
        with_compute_dtype(cfg_.precision.compute, [&] { return pm_.model->loss(b.tokens, b.targets, b.documents); });
    const auto part = losses.part(on_loss(m, loss), m);
    before_backward(m, 0);
    (loss_scale.defined() ? part * loss_scale : part).backward();
  }
  return losses.total(batches.front().tokens.device());
}

at::Tensor TrainStep::sum_moe_statistics(StepValues& out, int64_t accum, const at::TensorOptions& options) {
  torch::NoGradGuard no_grad;
  const auto f64 = options.dtype(torch::kFloat64);
  const int64_t layers = cfg_.model.n_layers, experts = cfg_.model.moe_experts;
  const auto flat = [&](const at::Tensor& t, int64_t n) {  // none ran here (another stage's blocks): zeros
    return t.defined() ? t.to(torch::kFloat64).reshape({-1}) : torch::zeros({n}, f64);
  };
  const auto [routed, dropped] = pm_.model->take_moe_drops();
  // [balance, z, routed pairs, dropped pairs, loads...]: one exchange over the stages and
  // one over the data-parallel ranks for all of them.
  auto packed = torch::cat({flat(pm_.model->take_moe_balance(), 1), flat(pm_.model->take_moe_z(), 1),
                            torch::tensor({static_cast<double>(routed), static_cast<double>(dropped)}, f64),
                            flat(pm_.model->take_moe_loads(), layers * experts)});
  packed = across_stages(packed);
  if (pm_.data_parallel) packed = pm_.data_parallel->sum(packed);
  // The balance and z: means over every block of every micro-batch of every replica.
  const auto blocks = static_cast<double>(layers * accum * batch_.replicas());
  out.moe_balance = packed[0] / blocks;
  if (cfg_.model.moe_z_loss > 0) out.moe_z = packed[1] / blocks;
  if (cfg_.model.moe_capacity_factor > 0) out.moe_dropped = packed[3] / packed[2].clamp_min(1);
  return packed.narrow(0, 4, layers * experts).view({layers, experts});
}

at::Tensor TrainStep::across_stages(const at::Tensor& x) {
  if (!pm_.pipeline) return x;
  auto t = x.reshape({-1}).clone();
  dist_->pp->all_reduce_sum(t, "loss");
  return t.view(x.sizes());
}

double TrainStep::validation_loss(const TokenSplit& split, int64_t batches) {
  const int64_t seq_len = cfg_.data.seq_len, micro = batch_.micro_batch;
  const auto contents = BatchContents::of(cfg_.data);
  EvalLosses losses;
  if (pm_.pipeline) {
    pm_.model->eval();
    losses = sum_eval_losses([&](const Batch& b) { return pm_.pipeline->forward_loss(b); },
                             [&](const at::Tensor& t) { return pm_.model->loss_targets(t); }, split, seq_len, micro,
                             batches, dp_rank_, batch_.dp, contents);
    losses.weighted = across_stages(torch::tensor(losses.weighted, torch::kFloat64)).item<double>();
    pm_.model->train();
  } else {
    losses = evaluate_losses(pm_.model, split, seq_len, micro, batches, dp_rank_, batch_.dp, cfg_.precision.compute,
                             contents);
  }
  if (pm_.data_parallel) {
    losses.weighted = pm_.data_parallel->sum(losses.weighted);
    losses.counted = pm_.data_parallel->sum(losses.counted);
  }
  return losses.mean();
}

}  // namespace tide
