// A long command's progress over bytes (a checkpoint's verification, an export) shown as
// it goes: a line redrawn on a terminal, else a log line at each stage and every 10 s (a
// daemon's child logs to a file); and, for a daemon, a small JSON file that it reads to
// answer `exports` (docs/protocol.md: {"stage", "done", "total"}).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "tide/engine/io/progress.h"

namespace tide::worker {

class ProgressReport {
 public:
  // `file`: where the daemon looks ("": none). Replaced whole at each write (a reader
  // never sees half of one), at most a few times a second.
  explicit ProgressReport(std::string file = "");
  // What the engine's long functions take; refers to this report.
  Progress progress();

 private:
  void update(const std::string& stage, int64_t done, int64_t total);
  void write_file(const std::string& stage, int64_t done, int64_t total);

  std::string file_;
  bool tty_ = false, file_failed_ = false;
  std::string stage_;
  std::chrono::steady_clock::time_point shown_{}, written_{};
};

// "verifying 1.20 of 3.40 GiB (35%)".
std::string describe_byte_progress(const std::string& stage, int64_t done, int64_t total);

}  // namespace tide::worker
