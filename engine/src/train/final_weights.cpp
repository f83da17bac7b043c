#include "final_weights.h"

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
#include "tide/engine/train/run_files.h"
#include "tide/engine/train/tensor_memory.h"

namespace tide {

int64_t save_final_weights(const std::string& path, const RunConfig& cfg, ParallelModel& pm, Distributed* dist,
                           c10::Device device) {
  torch::NoGradGuard no_grad;
  const int64_t before = host_tensor_bytes();
  reset_peak_host_tensor_bytes();
  const int pp = dist ? dist->pp->size() : 1;
  const int stage = dist ? dist->pp->rank() : 0;
  const bool leader = !dist || dist->world->rank() == 0;
  // Other replicas take part in their ZeRO-3 gathers only; a stage's first rank sends.
  const bool first_replica = !dist || dist->dp->rank() == 0;
  const bool sender = pp > 1 && stage > 0 && first_replica && dist->tp->rank() == 0;
  const auto stages = pp > 1 ? partition_stages(cfg.model, pp, cfg.data.seq_len, cfg.parallel.pipeline_stages,
                                                cfg.parallel.virtual_stages, cfg.data.document_attention)
                             : std::vector<PipelineStage>{pm.stage};
  const auto units = parameter_unit_layout(cfg.model);
  // The whole model's, in its order; LoRA's adapters merged into their projections.
  const ModelConfig written = without_lora(cfg.model);
  const auto params = parameter_shapes(written);
  const TensorSource whole =
      merged_weights(cfg.model, [&](const std::string& name) { return pm.model->whole_parameter(name); });

  std::unique_ptr<SafetensorsStream> out;
  if (leader) {
    std::vector<SafetensorsEntry> entries;
    for (const auto& p : params) entries.push_back({p.name, "F32", p.shape, 0, 0});
    out = std::make_unique<SafetensorsStream>(path, std::move(entries), weights_metadata(written));
  }
  auto write = [&](const std::string& name, const torch::Tensor& t) {
    const auto host = t.to(torch::kCPU, torch::kFloat32).contiguous();
    out->write(name, host.data_ptr(), static_cast<size_t>(host.nbytes()));
  };
  DataParallel* dp = pm.data_parallel.get();
  int held = -1;  // the unit held whole
  int sent = 0;
  std::vector<int> received(static_cast<size_t>(pp), 0);  // per stage, in its send order
  for (const auto& p : params) {
    const std::string& name = p.name;
    int owner = 0;
    while (!stage_owns(stages[static_cast<size_t>(owner)], name)) ++owner;
    if (owner != stage) {
      if (!leader) continue;
      auto buffer = torch::empty(p.shape, torch::TensorOptions().dtype(torch::kFloat32).device(device));
      dist->pp->recv(buffer, owner, received[static_cast<size_t>(owner)]++, "weights " + name);
      write(name, buffer);
      continue;
    }
    if (dp && units.unit_of(name) != held) {
      if (held >= 0) dp->release_whole(held);
      held = units.unit_of(name);
      dp->hold_whole(held);
    }
    if (!first_replica) continue;
    const auto t = whole(name);
    if (leader)
      write(name, t);
    else if (sender)
      dist->pp->send(t.contiguous(), 0, sent++, "weights " + name)->wait();
  }
  if (dp && held >= 0) dp->release_whole(held);
  if (out) out->commit();
  return peak_host_tensor_bytes() - before;
}

}  // namespace tide
