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

namespace tide {

class Comm;

struct BoundaryActions {
  bool stop = false;
  bool checkpoint = false;
  // Fields changed at this boundary: path and new value (JSON text).
  std::vector<std::pair<std::string, std::string>> changes;
};

class LiveControl {
 public:
  using Take = std::function<std::string()>;
  using Emit = std::function<void(const std::string& kind, const nlohmann::json& body)>;
  // Checks a whole candidate configuration beyond the schema (the layout's divisibility);
  // throws ConfigError.
  using Check = std::function<void(const RunConfig&)>;

  // world: every rank of the job (null: one process). take and emit are used on rank 0.
  LiveControl(Comm* world, Take take, Emit emit);

  // Every rank, at the boundary before 0-based step `step`: the commands rank 0 took
  // since the last boundary, applied in order. `set` changes `cfg` only when every field
  // is live and the result passes the schema, validate() and `check`; otherwise nothing
  // changes and a "rejected" event says why. While paused this waits here, every rank,
  // until a resume or a stop arrives.
  BoundaryActions at_boundary(int64_t step, RunConfig& cfg, const Check& check);

 private:
  std::string receive();  // rank 0's commands on every rank
  void apply(const nlohmann::json& command, int64_t step, RunConfig& cfg, const Check& check, BoundaryActions& out);

  Comm* world_;
  bool leader_;
  Take take_;
  Emit emit_;
  bool paused_ = false;
};

}  // namespace tide
