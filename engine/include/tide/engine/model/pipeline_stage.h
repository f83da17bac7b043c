// The part of the model one pipeline stage holds: blocks [first_block, end_block); the
// first stage also holds the embeddings, the last the final norm and the output head
// (with tied embeddings, its own copy of the embedding matrix, kept equal to the first
// stage's by summing their gradients).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tide/engine/config.h"

namespace tide {

struct PipelineStage {
  int64_t first_block = 0, end_block = -1;  // end -1: through the last block
  bool first = true, last = true;
};

// Contiguous blocks for each of pp stages, at least one each: `given` blocks per stage
// when not empty (they must add up to the model's blocks), otherwise the cut that
// minimises the most expensive stage, where a block costs its training FLOPs per token
// and the last stage also pays for the output projection. Throws ConfigError naming the
// field when the stages cannot be cut.
std::vector<PipelineStage> partition_stages(const ModelConfig& m, int64_t pp, int64_t seq_len,
                                            const std::vector<int64_t>& given = {});

// Whether the stage owns the whole model's parameter `name` (the last stage's copy of
// tied embeddings is not owned: the first stage's is).
bool stage_owns(const PipelineStage& stage, const std::string& name);

}  // namespace tide
