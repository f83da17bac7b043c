// Live control of a training run: commands decided on rank 0 (pause, resume, stop,
// checkpoint now, set a live recipe field) reach every rank through one broadcast per
// step boundary, so every rank applies them at the same step.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tide/engine/config.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/run_layout.h"

namespace tide {

class Comm;

struct BoundaryActions {
  bool stop = false;
  bool checkpoint = false;
  // Fields changed at this boundary: path and new value (JSON text).
  std::vector<std::pair<std::string, std::string>> changes;
  // What the changes need of the trainer beyond the new configuration, one each.
  std::vector<LiveEffect> effects;
};

class LiveControl {
 public:
  using Take = std::function<std::string()>;
  using Emit = std::function<void(const std::string& kind, const nlohmann::json& body)>;

  // world: every rank of the job (null: one process). take and emit are used on rank 0.
  // `batch`: how the job cuts a step's batch, which a changed batch size must fit.
  LiveControl(Comm* world, Take take, Emit emit, BatchLayout batch);

  // Every rank, at the boundary before 0-based step `step`: the commands rank 0 took
  // since the last boundary, applied in order. `set` changes `cfg` only when
  // check_live_change accepts it; otherwise nothing changes and a "rejected" event says
  // why. While paused this waits here, every rank, until a resume or a stop arrives.
  // before_commands runs once, before the first command is applied (not at all when none
  // came): the trainer brings its view of the run up to the boundary there.
  BoundaryActions at_boundary(int64_t step, RunConfig& cfg, const std::function<void()>& before_commands = {});

 private:
  std::string receive();  // rank 0's commands on every rank
  void apply(const nlohmann::json& command, int64_t step, RunConfig& cfg, BoundaryActions& out);

  Comm* world_;
  bool leader_;
  Take take_;
  Emit emit_;
  BatchLayout batch_;
  bool paused_ = false;
};

}  // namespace tide
