// A run's model.safetensors: one process's weights, written from whatever layout trained
// them without any rank holding the whole model.
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

#include "tide/engine/config.h"

namespace tide {

struct Distributed;
struct ParallelModel;

// Every rank calls it. The whole model's parameters in its order, each made whole where
// it lives (its ZeRO-3 unit gathered in fp32, its tensor-parallel slices joined) and
// written by the leader as it arrives; a pipeline stage's first rank sends its own to the
// leader; LoRA's frozen base is read again from the run's initial weights (as `tide ckpt
// export` reads it), its adapters merged in. Any rank holds at most one gathered unit and
// one whole parameter (two while its tensor-parallel slices are joined) beyond what it
// trains with. The bytes are those one
// process holding the same values writes. Returns the most host tensor bytes this rank
// held at once while saving beyond what it held before (tensor_memory.h).
int64_t save_final_weights(const std::string& path, const RunConfig& cfg, ParallelModel& pm, Distributed* dist,
                           c10::Device device);

// Every rank calls it. LoRA: the adapters (model.lora_rank), gathered whole onto the
// leader from whatever layout trained them, written there as PEFT's adapter directory
// `dir` (lora.h: write_peft_adapter).
void save_final_adapter(const std::string& dir, const RunConfig& cfg, ParallelModel& pm, Distributed* dist,
                        c10::Device device);

}  // namespace tide
