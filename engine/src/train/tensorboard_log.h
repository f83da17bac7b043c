// A run's scalars as TensorBoard event files, <run>/tb/events.out.tfevents.<time>.<host>,
// written by the leader beside metrics.jsonl: TFRecord framing (length, masked CRC-32C)
// around Event protocol buffers holding Summary values, as TensorFlow's writer makes
// them, so that `tensorboard --logdir runs/` reads them.
//
// The few messages are encoded here rather than through libprotobuf: LibTorch's libraries
// carry a protobuf of their own, and a second one in the same process is the kind of
// duplicate std/library code that build.symbol_binding guards against.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

#include "tide/engine/train/metrics.h"

namespace tide {

class TensorBoardLog {
 public:
  // Opens a new event file in `dir` (created). With resumed_step > 0, first a "start"
  // record at that step: TensorBoard then drops the steps after it from earlier files, as
  // metrics.jsonl drops the rows of an attempt that did not reach a checkpoint.
  TensorBoardLog(const std::string& dir, int64_t resumed_step);

  // One step's figures: loss, grad_norm, lr, tokens_per_second, mfu, step_seconds,
  // val_loss when evaluated, and memory and communication, as scalars at m.step.
  void write(const StepMetrics& m);
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);

  std::string path_;
  std::ofstream out_;
};

// CRC-32C (Castagnoli) of `data`, as TFRecord frames use it before masking.
uint32_t crc32c(const std::string& data);

}  // namespace tide
