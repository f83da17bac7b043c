// Checkpoints: `checkpoints/step-NNNNNNNN/` in the run directory, one safetensors file
// per rank (`rank-NNNNN.safetensors`) holding the pieces of parameters and AdamW moments
// that rank owns, each piece described by the parameter's name, its global shape, the
// tensor-parallel slice and the element range it covers, plus `manifest.json` (layout,
// step, data position, every file's size and XXH3 hash) and a `COMMITTED` marker.
// docs/checkpoints.md is the format's contract.
//
// A save is written into `step-N.tmp/`, every file fsynced, the directory renamed into
// place, the marker and then the `latest` pointer written last: a crash at any moment
// leaves the previous checkpoint whole. A load verifies sizes and hashes and can read a
// checkpoint written under any layout (dp, tp, pp, ZeRO stage, world size).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tide/engine/checkpoint/checkpoint_index.h"
#include "tide/engine/config.h"

namespace at {
class Tensor;
}

namespace tide {

class AdamW;
class DataParallel;
class FlatParameters;
class TransformerImpl;
struct Distributed;

// fp16's loss scale (LossScaler) as a checkpoint keeps it.
struct LossScaleState {
  double scale = 0;
  int64_t good_steps = 0;  // steps without an overflow since the scale last changed
};

// What a resumed run continues from.
struct ResumeState {
  int64_t step = 0;             // optimizer steps completed
  int64_t optimizer_steps = 0;  // AdamW's bias-correction count
  int64_t loader_cursor = 0;    // sequences consumed
  std::optional<LossScaleState> loss_scale;  // saved by an fp16 run
  std::string dir;
};

// This rank's view of what it owns and where it lives, for saving and loading.
struct CheckpointParts {
  const RunConfig* cfg = nullptr;
  TransformerImpl* model = nullptr;  // names, tensor-parallel slices, pipeline stage
  FlatParameters* flat = nullptr;    // layout of the local parameters
  AdamW* optim = nullptr;            // params() buffer, moments
  Distributed* dist = nullptr;       // null: one process
  // ZeRO-3 under LoRA: the frozen base's layout, whose pieces on this rank
  // (data_parallel's frozen_shard) a restore writes (parallelize.h); null: the model holds
  // its frozen weights whole.
  const FlatParameters* frozen = nullptr;
  DataParallel* data_parallel = nullptr;
  // Expert parallelism: this rank's experts' layout and optimizer (parallelize.h), whose
  // pieces the ranks that hold the same experts share; null without.
  FlatParameters* expert_flat = nullptr;
  AdamW* expert_optim = nullptr;
};

class Checkpointer {
 public:
  // root: the run's checkpoints directory.
  Checkpointer(std::string root, CheckpointParts parts);
  ~Checkpointer();  // waits for a save in flight

  // Every rank calls it at the same step boundary. The pieces are copied to host
  // memory now; the files are written in the background (checkpoint.async) or before
  // this returns. Errors of the write are logged and reported to the on_finished
  // listener, never thrown: training goes on, older checkpoints stay.
  void save(int64_t step, int64_t optimizer_steps, int64_t loader_cursor,
            const std::optional<LossScaleState>& loss_scale = std::nullopt);
  // Waits for the save in flight, if any.
  void wait();
  // Ends the save in flight without committing it (the run has failed: the peers whose
  // files rank 0 would wait for may be gone) and waits for its thread; the checkpoints
  // committed before stay as they are.
  void abandon();
  // Called once per save when it is committed (error empty) or has failed (`dir` empty),
  // from the thread that wrote it; rank 0 sees the whole save, other ranks their file.
  // `seconds`: from the snapshot to the commit or the failure.
  using Listener = std::function<void(int64_t step, const std::string& dir, const std::string& error, double seconds)>;
  void on_finished(Listener listener);

  // Reads `dir` (written under any layout) into this rank's parameters and moments.
  // Throws with the problems named when verification fails, and when the model's frozen
  // parameters (LoRA's base, which a checkpoint leaves out: the run sets them first from
  // its initial weights) are not those the checkpoint was trained on.
  ResumeState load(const std::string& dir);
  // Sets this rank's parameters (its slices, its pieces) from whole tensors: what
  // whole_parameter(name) returns, in fp32, for every parameter this rank holds a part of,
  // frozen ones (LoRA's base) included. For a trained parameter it may return an
  // undefined tensor: the source does not hold it (a LoRA adapter in base weights), and
  // it keeps its initial values. Moments stay zero and the optimizer at step 0: a run
  // that starts from given weights. `source` names them in errors.
  void initialise(const std::function<at::Tensor(const std::string&)>& whole_parameter, const std::string& source);
  // The newest committed checkpoint under root that verifies; logs every one skipped.
  std::optional<std::string> latest_valid() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tide
