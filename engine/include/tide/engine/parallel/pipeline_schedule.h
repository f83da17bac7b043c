// The order of a pipeline stage's work in one step (no LibTorch: the planner walks it too).
//
// Schedules (parallel.pipeline_schedule), for pp stages and M micro-batches:
//   gpipe: every forward, then every backward. Holds all micro-batches' activations.
//   1f1b:  stage s runs min(pp - s - 1, M) forwards, then alternates one forward and
//          one backward, then drains. Holds at most pp - s micro-batches' activations;
//          the same bubble as GPipe, (pp - 1) / (M + pp - 1) of the step.
//   1f1b with V chunks per rank (parallel.virtual_stages; Megatron's interleaved
//          schedule): the micro-batches go in groups of pp through chunk 0, then the
//          same group through chunk 1, ...; stage s warms up with 2 (pp - s - 1) + (V - 1) pp
//          chunk-forwards, then alternates. A chunk is 1/V of the stage, so the bubble
//          shrinks V times, for V times the messages and at most 1 + (pp - 1)/(pp V) times
//          1F1B's activations on the first stage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tide {

// One unit of a stage's work: the forward or the backward of one micro-batch through one
// of the stage's chunks.
struct PipelineOp {
  int chunk = 0;
  int64_t micro_batch = 0;
  bool forward = true;
  bool operator==(const PipelineOp& o) const {
    return chunk == o.chunk && micro_batch == o.micro_batch && forward == o.forward;
  }
};

// The order of one stage's work. chunks > 1 (interleaved) needs "1f1b" and micro_batches a
// multiple of stages; throws std::invalid_argument otherwise.
std::vector<PipelineOp> pipeline_schedule(const std::string& kind, int stage, int stages, int64_t micro_batches,
                                          int chunks = 1);

}  // namespace tide
