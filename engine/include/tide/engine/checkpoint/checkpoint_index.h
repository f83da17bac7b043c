// What is on disk under a checkpoints directory: the committed step directories, their
// manifests, and whether their files are sound. No LibTorch, so the controller (which
// never touches tensors) lists a run's checkpoints with it. docs/checkpoints.md is the
// format's contract.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tide/engine/io/progress.h"

namespace tide {

constexpr int kCheckpointFormat = 1;

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
};

// Committed checkpoints under `root`, oldest first (temporaries and uncommitted
// directories are not listed).
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);
// What is wrong with a checkpoint directory: a missing or unreadable manifest, a
// missing file, a size or hash that differs, each naming the file. Empty: sound. Every
// byte is read: `progress` hears ("verifying", bytes read, the manifest's bytes).
std::vector<std::string> verify_checkpoint(const std::string& dir, const Progress& progress = {});
// The manifest; throws naming the file when it is missing or not a tide manifest.
nlohmann::json read_manifest(const std::string& dir);

}  // namespace tide
