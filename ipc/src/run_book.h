// The runs as the controller knows them: the registry on disk, and for each unfinished
// run its resolved recipe (live changes included) and its latest metrics. Every state
// change goes through set_state: saved, logged, published.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <spdlog/common.h>
#include <nlohmann/json.hpp>

#include "event_bus.h"
#include "tide/engine/config.h"
#include "tide/ipc/run_registry.h"

namespace tide::ipc {

class RunBook {
 public:
  // Loads the registry; runs that had workers when the last controller ended are queued
  // again, to resume from their latest checkpoints.
  RunBook(const std::string& state_dir, EventBus& bus);

  RunRegistry& registry() { return registry_; }
  const RunRegistry& registry() const { return registry_; }
  // The run a request body names ("run"); not_found when there is none.
  RunRecord& find(const nlohmann::json& body);
  // A new run, queued: its recipe text and resolved config written beside its record.
  RunRecord& add(RunRecord r, const RunConfig& cfg, const std::string& recipe_text);

  // The resolved recipe with the live changes taken so far (read back from the run
  // directory after a controller restart).
  const RunConfig& config_of(const RunRecord& r);
  void set_state(RunRecord& r, RunState s, nlohmann::json extra = nlohmann::json::object());
  // A live change the run took: the view of its recipe, and the record a restart replays.
  void record_live_change(RunRecord& r, const nlohmann::json& values);
  // A step's metrics from rank 0: the run's progress, kept for status and snapshots.
  void record_metrics(RunRecord& r, const nlohmann::json& metrics);
  const nlohmann::json* latest_metrics(const std::string& run) const;
  // A rank's own figures of a step (every rank's, rank 0's included): the latest of each
  // rank is kept for status. With more than one rank, once every rank has sent a step's
  // figures they become a row of <run>/ranks.jsonl and a "ranks" event (rank_row()).
  void record_rank(const RunRecord& r, int rank, const nlohmann::json& figures);
  // A save committed or failed, from its checkpoint event: counted for status and /metrics.
  void record_checkpoint(const RunRecord& r, const nlohmann::json& event);
  // The run's latest figures of each rank ({"0": {...}, ...}) and its saves so far
  // ({"saved", "failed", "last_seconds", "last_step"}), as status shows them.
  nlohmann::json ranks_of(const std::string& run) const;
  nlohmann::json checkpoint_stats_of(const std::string& run) const;
  // The run's latest evaluation ({"step", "val_loss"}, and "val_losses" under a data
  // blend), kept past the steps that do not evaluate; null before the first.
  nlohmann::json validation_of(const std::string& run) const;

  // A line of the controller's about a run, where the run's own lines are: appended to
  // its train.log and published as a log event (the controller's log has it too).
  void log(const std::string& run, spdlog::level::level_enum level, const std::string& line);
  // What a late subscriber to `prefix` missed: each unfinished run's state and latest
  // metrics, and the state of the last finished ones.
  void snapshot(const std::string& prefix);

  // Called with a run's id when it finishes, for the parts that hold state about it.
  void on_finished(std::function<void(const std::string& run)> fn) { finished_listeners_.push_back(std::move(fn)); }

 private:
  RunRegistry registry_;
  EventBus& bus_;
  std::map<std::string, RunConfig> configs_;  // unfinished runs
  std::map<std::string, nlohmann::json> metrics_;
  std::map<std::string, nlohmann::json> validation_;
  // One step's figures of every rank: a row once all have come.
  struct RankRows {
    int64_t attempt = -1;  // of the figures pending: a new attempt's do not mix with them
    std::map<int64_t, std::map<int, nlohmann::json>> pending;  // step → rank → figures
    int64_t written = -1;                                      // the step of the last row this controller wrote
  };
  void write_rank_row(const RunRecord& r, RankRows& rows, int64_t step);

  std::map<std::string, nlohmann::json> ranks_;             // run → {"<rank>": figures}
  std::map<std::string, RankRows> rank_rows_;               // unfinished runs of several ranks
  std::map<std::string, nlohmann::json> checkpoint_stats_;  // run → counts since this controller began
  std::vector<std::function<void(const std::string&)>> finished_listeners_;
};

}  // namespace tide::ipc
