// The part of the model one pipeline rank holds: one chunk of contiguous blocks, or with
// interleaving (parallel.virtual_stages = V) V chunks. The model is cut into pp × V
// virtual stages in order, and rank r runs virtual stages r, r + pp, r + 2·pp, … (Megatron's
// interleaved layout), so an activation visits every rank V times. The rank that runs the
// first chunk also holds the embeddings, the one that runs the last the final norm and the
// output head (with tied embeddings, its own copy of the embedding matrix, kept equal to the
// first's by summing their gradients).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tide/engine/config.h"
#include "tide/engine/model/parameter_names.h"

namespace tide {

// Blocks [first, end) of the whole model; end -1: through the last block.
struct BlockRange {
  int64_t first = 0, end = -1;
};

struct PipelineStage {
  std::vector<BlockRange> chunks{BlockRange{}};  // in model order: the rank's virtual stages
  bool first = true, last = true;                // runs the model's first chunk / its last
};

// The blocks of each of pp ranks, each of `virtual_stages` chunks of at least one block:
// `given` blocks per virtual stage when not empty (pp × virtual_stages counts, in model
// order, adding up to the model's blocks), otherwise the cut that minimises the most
// expensive virtual stage, where a block costs its weights' training FLOPs per token and
// its attention's over the keys the kernel computes (flops.h, computed_keys: a layer with
// a mask, a window's or `documents`', costs more than a causal one without) and the last
// one also pays for the output projection. Throws ConfigError naming the field when the
// stages cannot be cut.
std::vector<PipelineStage> partition_stages(const ModelConfig& m, int64_t pp, int64_t seq_len,
                                            const std::vector<int64_t>& given = {}, int64_t virtual_stages = 1,
                                            bool documents = false);

// The number of blocks in one chunk, and in all of the stage's.
int64_t range_blocks(const BlockRange& range, int64_t n_layers);
int64_t stage_blocks(const PipelineStage& stage, int64_t n_layers);

// How many of a chunk's blocks, its first ones, activation checkpointing recomputes: none
// without it, model.recompute_blocks with it (all when 0 or more than the chunk holds).
int64_t recomputed_blocks(const ModelConfig& m, const BlockRange& range);

// The units of the flat parameter buffer (parameter_names.h: ParameterUnitLayout) whose
// gradients a backward through chunk `chunk` of the stage produces, in the order it
// completes them: the head's unit first where the chunk ends the model, its blocks from
// the last, and unit 0 last where the chunk starts the model.
std::vector<int> chunk_units(const PipelineStage& stage, int chunk, const ParameterUnitLayout& units);

// Whether the stage owns the whole model's parameter `name` (the last stage's copy of
// tied embeddings is not owned: the first stage's is).
bool stage_owns(const PipelineStage& stage, const std::string& name);

}  // namespace tide
