// Names and durable writes of the checkpoint directory (internal).
#pragma once

#include <cstdint>
#include <string>

namespace tide {

std::string step_dir_name(int64_t step);  // "step-00000042"
std::string rank_file_name(int rank);     // "rank-00003.safetensors"
std::string hex64(uint64_t x);
// fsync of a file or a directory.
void fsync_path(const std::string& path);
// `text` into `path` through a temporary, fsynced, renamed, the directory fsynced.
void write_durably(const std::string& path, const std::string& text);

}  // namespace tide
