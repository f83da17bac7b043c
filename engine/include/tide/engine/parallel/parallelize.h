// The parallelize step (torchtitan's shape): from a validated layout, this rank's part of
// the model and everything that trains it — the tensor-parallel slice and sequence
// parallelism, the pipeline stage's blocks, activation checkpointing (the model
// config's), the flat buffers laid out for the ZeRO stage, the data-parallel reducer and
// the optimizer. The training loop works on what it returns and never asks which layout
// made it.
#pragma once

#include <memory>

#include <c10/core/Device.h>

#include "tide/engine/config.h"
#include "tide/engine/model/pipeline_stage.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/run_layout.h"

namespace tide {

class AdamW;
class DataParallel;
class FlatParameters;
class Pipeline;
struct Distributed;

struct ParallelModel {
  Transformer model{nullptr};  // this rank's slice of its stage
  PipelineStage stage;         // the whole model when pp = 1
  std::unique_ptr<FlatParameters> flat;
  // ZeRO-3 under LoRA: the frozen base's layout, which data_parallel shards; null: the
  // model holds its frozen weights whole.
  std::unique_ptr<FlatParameters> frozen;
  // Expert parallelism (parallel.ep): this rank's experts, which `flat` and `optim` leave
  // out, laid out and updated apart (data_parallel reduces them over the ranks that hold
  // the same experts: DataParallel::join_experts); both null without.
  std::unique_ptr<FlatParameters> expert_flat;
  std::unique_ptr<DataParallel> data_parallel;  // null in one process
  std::unique_ptr<AdamW> optim;
  std::unique_ptr<AdamW> expert_optim;
  std::unique_ptr<Pipeline> pipeline;  // null when pp = 1

  ParallelModel();
  ParallelModel(ParallelModel&&) noexcept;
  ParallelModel& operator=(ParallelModel&&) noexcept;
  ~ParallelModel();  // detaches the ZeRO-3 parameter units from the model first
};

// Builds the model initialised from cfg.seed (every layout holds the same values as one
// process), on `device`, and parallelizes it over `dist` (null: one process). The model
// is built as shapes and each parameter written where it stays: no rank holds more of it
// at once than its flat buffer, or under ZeRO-3 its pieces and one whole unit. Under bf16
// (fp16) compute LoRA's frozen weights that are only ever multiplied are held in that
// dtype alone (ZeRO-3: its pieces of the whole base), the bits their working copies
// would have.
ParallelModel parallelize(const RunConfig& cfg, Distributed* dist, const BatchLayout& batch, c10::Device device);

}  // namespace tide
