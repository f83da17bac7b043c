// Files of one JSON object per line, each with a "step": a run's metrics.jsonl (rank 0's
// rows, written by the leader) and ranks.jsonl (every rank's, written by tided).
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>

#include <nlohmann/json_fwd.hpp>

namespace tide {

// Appends one JSON object per line, flushed per line so a reader can tail it.
class JsonlWriter {
 public:
  explicit JsonlWriter(const std::string& path);
  void write(const nlohmann::json& record);

 private:
  std::string path_;
  std::ofstream out_;
};

// A run rewrites the steps after the one it starts from: drops the rows whose "step" is
// past last_step. Returns the loss of the last row kept, if it has one (a run resumed at
// its end reports it as its final loss).
std::optional<double> truncate_step_rows(const std::string& path, int64_t last_step);

}  // namespace tide
