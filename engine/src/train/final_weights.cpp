#include "final_weights.h"

#include <functional>
#include <map>
#include <memory>
#include <vector>

#include <torch/types.h>

#include "tide/engine/io/safetensors.h"
#include "tide/engine/model/lora.h"
#include "tide/engine/model/parameter_names.h"
#include "tide/engine/model/pipeline_stage.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/parallel/comm.h"
#include "tide/engine/parallel/data_parallel.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/parallel/parallelize.h"
#include "tide/engine/train/initial_weights.h"
#include "tide/engine/train/run_files.h"
#include "tide/engine/train/tensor_memory.h"

namespace tide {

namespace {
using Take = std::function<void(const std::string&, const torch::Tensor&)>;

// Each of `params` made whole where it lives (from `whole` there) and given to `take` on
// the leader, in their order; every rank calls it.
void gather_to_leader(const std::vector<TensorShape>& params, const TensorSource& whole, const RunConfig& cfg,
                      ParallelModel& pm, Distributed* dist, c10::Device device, const Take& take) {
  const int pp = dist ? dist->pp->size() : 1;
  const int stage = dist ? dist->pp->rank() : 0;
  const bool leader = !dist || dist->world->rank() == 0;
  // Other replicas take part in their ZeRO-3 gathers only; a stage's first rank sends.
  const bool first_replica = !dist || dist->replicas().rank() == 0;
  const bool sender = pp > 1 && stage > 0 && first_replica && dist->tp->rank() == 0;
  const auto stages = pp > 1 ? partition_stages(cfg.model, pp, cfg.data.seq_len, cfg.parallel.pipeline_stages,
                                                cfg.parallel.virtual_stages, cfg.data.document_attention)
                             : std::vector<PipelineStage>{pm.stage};
  const auto units = parameter_unit_layout(cfg.model);
  DataParallel* dp = pm.data_parallel.get();
  int held = -1;  // the unit held whole
  int sent = 0, sent_experts = 0;
  std::vector<int> received(static_cast<size_t>(pp), 0);  // per stage, in its send order
  // Expert parallelism: an expert's holders are the ranks of its expert-parallel rank
  // among the first dp / ep replicas (dp coordinate = that rank); the first
  // tensor-parallel one sends it to the leader directly, in the order of `params`.
  const int64_t experts_per_rank = dist && dist->ep ? cfg.model.moe_experts / dist->ep->size() : 0;
  std::map<int, int> received_experts;  // the leader's, per sending rank
  for (const auto& p : params) {
    const std::string& name = p.name;
    int owner = 0;
    while (!stage_owns(stages[static_cast<size_t>(owner)], name)) ++owner;
    if (owner == stage && dp && units.unit_of(name) != held) {  // every rank of the stage gathers
      if (held >= 0) dp->release_whole(held);
      held = units.unit_of(name);
      dp->hold_whole(held);
    }
    const int64_t expert = experts_per_rank > 0 ? expert_index(name) : -1;
    const int holder_dp = static_cast<int>(expert >= 0 ? expert / experts_per_rank : 0);
    int expert_sender = -1;  // the global rank that sends an expert, the leader itself included
    if (expert >= 0) {
      GridCoords c;
      c.dp = holder_dp;
      c.pp = owner;
      expert_sender = dist->grid.rank_of(c);
    }
    if (owner != stage || (leader && expert_sender > 0)) {
      if (!leader) continue;
      auto buffer = torch::empty(p.shape, torch::TensorOptions().dtype(torch::kFloat32).device(device));
      if (expert_sender > 0)
        dist->world->recv(buffer, expert_sender, received_experts[expert_sender]++, "weights " + name);
      else
        dist->pp->recv(buffer, owner, received[static_cast<size_t>(owner)]++, "weights " + name);
      take(name, buffer);
      continue;
    }
    if (expert >= 0) {
      if (dist->grid.coords().dp != holder_dp) continue;
      const auto t = whole(name);
      if (leader)
        take(name, t);
      else if (dist->tp->rank() == 0)
        dist->world->send(t.to(device).contiguous(), 0, sent_experts++, "weights " + name)->wait();
      continue;
    }
    if (!first_replica) continue;
    const auto t = whole(name);
    if (leader)
      take(name, t);
    else if (sender)
      dist->pp->send(t.to(device).contiguous(), 0, sent++, "weights " + name)->wait();  // a LoRA base's from the host
  }
  if (dp && held >= 0) dp->release_whole(held);
}
}  // namespace

int64_t save_final_weights(const std::string& path, const RunConfig& cfg, ParallelModel& pm, Distributed* dist,
                           c10::Device device) {
  torch::NoGradGuard no_grad;
  const int64_t before = host_tensor_bytes();
  reset_peak_host_tensor_bytes();
  const bool leader = !dist || dist->world->rank() == 0;
  // The whole model's, in its order; LoRA's adapters merged into their projections.
  const ModelConfig written = without_lora(cfg.model);
  const auto params = parameter_shapes(written);
  const TensorSource held = [&](const std::string& name) { return pm.model->whole_parameter(name); };
  // LoRA: the base is its initial weights (checkpoint.init_from, or the seed's draw) read
  // again, as `tide ckpt export` merges a checkpoint's adapters onto them: under bf16
  // compute the run holds its matmul weights rounded (parallelize.h), under ZeRO-3 in
  // pieces that are not gathered for this.
  const TensorSource whole =
      cfg.model.lora_rank == 0
          ? held
          : merged_weights(cfg.model, [held, initial = initial_parameter_values(cfg)](const std::string& name) {
              return is_lora_parameter(name) ? held(name) : initial(name);
            });

  std::unique_ptr<SafetensorsStream> out;
  if (leader) {
    std::vector<SafetensorsEntry> entries;
    for (const auto& p : params) entries.push_back({p.name, "F32", p.shape, 0, 0});
    out = std::make_unique<SafetensorsStream>(path, std::move(entries), weights_metadata(written));
  }
  gather_to_leader(params, whole, cfg, pm, dist, device, [&](const std::string& name, const torch::Tensor& t) {
    const auto host = t.to(torch::kCPU, torch::kFloat32).contiguous();
    out->write(name, host.data_ptr(), static_cast<size_t>(host.nbytes()));
  });
  if (out) out->commit();
  return peak_host_tensor_bytes() - before;
}

void save_final_adapter(const std::string& dir, const RunConfig& cfg, ParallelModel& pm, Distributed* dist,
                        c10::Device device) {
  torch::NoGradGuard no_grad;
  std::vector<TensorShape> adapters;
  for (auto& p : parameter_shapes(cfg.model))
    if (is_lora_parameter(p.name)) adapters.push_back(std::move(p));
  std::map<std::string, torch::Tensor> held;  // the leader's: small beside the model
  gather_to_leader(
      adapters, [&](const std::string& name) { return pm.model->whole_parameter(name); }, cfg, pm, dist, device,
      // A copy: under ZeRO-3 `t` may be a view of a unit gathered only until the next.
      [&](const std::string& name, const torch::Tensor& t) {
        held[name] = t.to(torch::kCPU, torch::kFloat32, /*non_blocking=*/false, /*copy=*/true);
      });
  if (dist && dist->world->rank() != 0) return;
  write_peft_adapter(
      dir, cfg.model, [&](const std::string& name) { return held.at(name); }, cfg.checkpoint.init_from, "F32");
}

}  // namespace tide
