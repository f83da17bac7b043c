#include "tide/engine/parallel/parallelize.h"

#include <set>
#include <string>

#include <torch/types.h>

#include "tensor_parallel_group.h"
#include "tide/engine/model/compute_dtype.h"
#include "tide/engine/model/parameter_names.h"
#include "tide/engine/model/tensor_parallel.h"
#include "tide/engine/optim/adamw.h"
#include "tide/engine/optim/flat_parameters.h"
#include "tide/engine/parallel/comm.h"
#include "tide/engine/parallel/data_parallel.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/parallel/pipeline.h"

namespace tide {

ParallelModel::ParallelModel() = default;
ParallelModel::ParallelModel(ParallelModel&&) noexcept = default;
ParallelModel& ParallelModel::operator=(ParallelModel&&) noexcept = default;
ParallelModel::~ParallelModel() {
  if (model) model->set_parameter_units(nullptr);
}

namespace {
// The model of this rank's stage and tensor-parallel slice, as shapes: its parameters
// get memory and values where they are placed (flatten).
Transformer build_model(const RunConfig& cfg, Distributed* dist, const PipelineStage& stage) {
  TensorParallel tp;
  if (dist && dist->tp->size() > 1)
    tp = TensorParallel{tensor_parallel_group(*dist->tp), cfg.parallel.sequence_parallel};
  ExpertParallel ep;
  if (dist && dist->ep) ep = ExpertParallel{tensor_parallel_group(*dist->ep)};
  Transformer model(cfg.model, tp, stage, ParameterStorage::Deferred, ep);
  // Context parallelism changes no parameter: each rank computes on its share of every
  // sequence, its attention joining the others' as parallel.cp_comm says.
  if (dist && dist->cp)
    model->set_context_parallel(ContextParallel{tensor_parallel_group(*dist->cp), cfg.parallel.cp_comm == "all_to_all"
                                                                                      ? ContextComm::AllToAll
                                                                                      : ContextComm::AllGather});
  model->train();
  return model;
}

// The parameters the flat buffers leave out (frozen: LoRA's base weights), given memory
// on `device` and their initial values there: held whole on every rank, as one process
// holds them, but for ZeRO-3, which shards them (frozen_layout). Under bf16 (fp16)
// compute, a frozen weight that is only ever multiplied (`in_compute_dtype`:
// transformer.h, weights_read_in_compute_dtype) is held in that dtype alone, as PEFT and
// torchtune hold a base in bf16: its working copy would round the same fp32 values to the
// same bits, so every product is unchanged, for 2 bytes a weight rather than 4 held and 2
// more cast for each step. Norms and embeddings, read in fp32, stay fp32.
void place_frozen(TransformerImpl& model, c10::Device device, uint64_t seed, at::ScalarType compute) {
  torch::NoGradGuard no_grad;
  const auto in_compute_dtype = compute == at::kFloat ? std::set<std::string>{} : model.weights_read_in_compute_dtype();
  for (auto& item : model.named_parameters()) {
    auto& p = item.value();
    if (p.requires_grad()) continue;
    const auto dtype = in_compute_dtype.count(item.key()) ? compute : at::kFloat;
    p.set_data(torch::empty(p.sizes(), torch::TensorOptions().dtype(dtype).device(device)));
    model.initialise_parameter(item.key(), p, seed);
  }
}

// The flat buffers laid out for the ZeRO stage. A parameter every tensor-parallel rank
// holds whole counts once in the gradient norm, and the last stage's copy of tied
// embeddings not at all.
// Each parameter is drawn on the host (the same values as a CPU run, under any layout)
// and written into its place on `device`: the flat buffer, or under ZeRO-3 this rank's
// pieces, the only part of it this rank draws.
FlatParameters::Options flat_layout(const RunConfig& cfg, Distributed* dist, const BatchLayout& batch,
                                    const Transformer& model, const PipelineStage& stage, c10::Device device) {
  FlatParameters::Options layout;
  if (dist) layout = DataParallel::flat_options(cfg.parallel, static_cast<int>(batch.replicas()));
  layout.device = device;
  layout.initial_values = [model, seed = static_cast<uint64_t>(cfg.seed)](const std::string& name,
                                                                          const torch::Tensor& into, int64_t first) {
    model->initialise_parameter(name, into, seed, first);
  };
  layout.unit_of = [units = parameter_unit_layout(cfg.model)](const std::string& name) { return units.unit_of(name); };
  layout.counted = [m = model.get(), rank = model->tensor_parallel().rank(), stage](const std::string& name) {
    return stage_owns(stage, name) && (rank == 0 || m->tp_slice(name).dim >= 0);
  };
  return layout;
}

// ZeRO-3 shards LoRA's frozen base as it shards the trained parameters, in units of the
// same blocks: a 70B base is not held whole on every rank (torchtune's distributed LoRA
// shards it with FSDP likewise).
bool shards_frozen(const RunConfig& cfg, Distributed* dist) {
  return dist && cfg.model.lora_rank > 0 && cfg.parallel.zero == 3;
}
}  // namespace

ParallelModel parallelize(const RunConfig& cfg, Distributed* dist, const BatchLayout& batch, c10::Device device) {
  ParallelModel out;
  const int pp = dist ? dist->pp->size() : 1;
  if (pp > 1)
    out.stage =
        partition_stages(cfg.model, pp, cfg.data.seq_len, cfg.parallel.pipeline_stages, cfg.parallel.virtual_stages,
                         cfg.data.document_attention)[static_cast<size_t>(dist->pp->rank())];
  out.model = build_model(cfg, dist, out.stage);
  auto layout = flat_layout(cfg, dist, batch, out.model, out.stage, device);
  // Expert parallelism: this rank's experts in buffers of their own, padded for the
  // ranks that hold the same experts, which reduce and shard them.
  const bool spread_experts = dist && dist->ep;
  if (spread_experts) {
    auto experts = layout;
    const int holders = dist->expert_replicas->size();
    experts.pad_to = DataParallel::flat_options(cfg.parallel, holders).pad_to;
    experts.takes = is_expert_parameter;
    layout.takes = [](const std::string& name) { return !is_expert_parameter(name); };
    out.expert_flat = std::make_unique<FlatParameters>(*out.model, cfg.optimizer, experts);
  }
  out.flat = std::make_unique<FlatParameters>(*out.model, cfg.optimizer, layout);
  // The flat buffers placed the parameters; the model's state that trains without
  // gradients (the experts' routing biases) goes to the device as it is.
  for (auto& buffer : out.model->buffers()) buffer.set_data(buffer.to(device));
  const DType compute = resolve_compute_dtype(cfg.precision.compute, device);
  if (shards_frozen(cfg, dist)) {
    auto frozen = layout;
    frozen.frozen = true;
    frozen.grad = false;
    out.frozen = std::make_unique<FlatParameters>(*out.model, cfg.optimizer, frozen);
  } else {
    place_frozen(*out.model, device, static_cast<uint64_t>(cfg.seed), scalar_type_of(compute));
  }
  if (dist) {
    // The dp x cp ranks hold the same parameters: they average their gradients (each cp
    // rank's are of its share of the sequences) and share ZeRO's shards.
    out.data_parallel = std::make_unique<DataParallel>(
        dist->replicas(), *out.flat, cfg.parallel, compute, parameter_unit_layout(cfg.model),
        std::vector<Comm*>{dist->tp.get(), dist->pp.get()},
        [names = out.model->weights_read_in_compute_dtype()](const std::string& name) { return names.count(name) > 0; },
        out.frozen.get());
    if (spread_experts) {
      // The tensor-parallel, pipeline and expert-parallel ranks hold the other experts'
      // parts: the norm adds theirs.
      auto experts = std::make_unique<DataParallel>(
          *dist->expert_replicas, *out.expert_flat, cfg.parallel, compute, parameter_unit_layout(cfg.model),
          std::vector<Comm*>{dist->tp.get(), dist->pp.get(), dist->ep.get()},
          [names = out.model->weights_read_in_compute_dtype()](const std::string& name) {
            return names.count(name) > 0;
          });
      out.expert_optim = experts->make_optimizer(cfg.optimizer, cfg.parallel.offload_optimizer);
      out.data_parallel->join_experts(std::move(experts));
    }
    out.model->set_parameter_units(out.data_parallel->parameter_units());
    out.optim = out.data_parallel->make_optimizer(cfg.optimizer, cfg.parallel.offload_optimizer);
  } else {
    out.optim = std::make_unique<AdamW>(*out.flat, cfg.optimizer, cfg.parallel.offload_optimizer);
  }
  // Under bf16 (fp16) compute the optimizer writes the weights' working copy as it
  // updates them, where it updates them all: no cast in the step (compute_dtype.h).
  if (compute != DType::Float32) {
    out.optim->keep_working_copy(scalar_type_of(compute), out.flat->slots());
    if (out.expert_optim) out.expert_optim->keep_working_copy(scalar_type_of(compute), out.expert_flat->slots());
  }
  if (pp > 1) {
    const auto& tp = out.model->tensor_parallel();
    const int64_t t = cfg.data.seq_len / out.model->context_parallel().size() / (tp.sequence_parallel ? tp.size() : 1);
    // Tied embeddings: the first and last stages' gradients are summed after backward
    // (LoRA freezes them: none to sum).
    Comm* tied = cfg.model.tie_embeddings && cfg.model.lora_rank == 0 ? dist->embedding.get() : nullptr;
    out.pipeline = std::make_unique<Pipeline>(*dist->pp, out.model, cfg.parallel.pipeline_schedule,
                                              std::vector<int64_t>{batch.micro_batch, t, cfg.model.dim},
                                              cfg.precision.compute, tied);
  }
  return out;
}

}  // namespace tide
