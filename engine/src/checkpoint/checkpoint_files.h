// Names and durable writes of the checkpoint directory (internal).
#pragma once

#include <cstdint>
#include <string>

namespace tide {

std::string step_dir_name(int64_t step);  // "step-00000042"
// A rank's share in one file, or in several written side by side: part 0 is
// "rank-00003.safetensors" (it holds the rank's RNG state), part 2 "rank-00003.2.safetensors".
std::string rank_file_name(int rank, int part = 0);
std::string hex64(uint64_t x);
// fsync of a file or a directory.
void fsync_path(const std::string& path);
// `text` into `path` through a temporary, fsynced, renamed, the directory fsynced.
void write_durably(const std::string& path, const std::string& text);

}  // namespace tide
