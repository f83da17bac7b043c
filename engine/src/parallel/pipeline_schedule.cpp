#include "tide/engine/parallel/pipeline_schedule.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace tide {

std::vector<PipelineOp> pipeline_schedule(const std::string& kind, int stage, int stages, int64_t micro_batches,
                                          int chunks) {
  if (kind != "1f1b" && kind != "gpipe")
    throw std::invalid_argument(fmt::format("unknown pipeline schedule '{}' (gpipe or 1f1b)", kind));
  if (chunks < 1 || (chunks > 1 && (kind != "1f1b" || micro_batches % stages != 0)))
    throw std::invalid_argument(fmt::format(
        "{} over {} chunks per stage: interleaving needs 1f1b and micro-batches ({}) a multiple of the stages ({})",
        kind, chunks, micro_batches, stages));
  // The k-th chunk-forward of a stage: groups of `stages` micro-batches, each group
  // through chunk 0, then chunk 1, ...; the k-th chunk-backward walks the chunks back.
  // With one chunk these are micro-batch k's forward and backward.
  const int64_t group = static_cast<int64_t>(stages) * chunks;
  const auto forward = [&](int64_t k) {
    return PipelineOp{static_cast<int>((k / stages) % chunks), k / group * stages + k % stages, true};
  };
  const auto backward = [&](int64_t k) {
    return PipelineOp{chunks - 1 - static_cast<int>((k / stages) % chunks), k / group * stages + k % stages, false};
  };
  const int64_t total = micro_batches * chunks;
  std::vector<PipelineOp> ops;
  if (kind == "gpipe") {
    for (int64_t k = 0; k < total; ++k) ops.push_back(forward(k));
    for (int64_t k = 0; k < total; ++k) ops.push_back(backward(k));
    return ops;
  }
  // Enough forwards in flight that the stage never waits in the steady state: the
  // activations' way to the last stage and back's gradients, plus, interleaved, the other
  // chunks of the first group.
  const int64_t warmup =
      std::min<int64_t>(chunks == 1 ? stages - stage - 1 : 2 * (stages - stage - 1) + (chunks - 1) * stages, total);
  for (int64_t k = 0; k < warmup; ++k) ops.push_back(forward(k));
  for (int64_t k = 0; k + warmup < total; ++k) {
    ops.push_back(forward(warmup + k));
    ops.push_back(backward(k));
  }
  for (int64_t k = total - warmup; k < total; ++k) ops.push_back(backward(k));
  return ops;
}

}  // namespace tide
