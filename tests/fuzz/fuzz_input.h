// What the fuzz targets share: an input as the files a loader reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tide::fuzz {

// Separates the files of a several-file input (a dataset directory, a checkpoint): a
// line no real file of those kinds holds, so seeds are the real files joined by it.
inline constexpr std::string_view kPartSeparator = "\n=====tide-fuzz-part=====\n";

// The input cut at each separator; always `count` parts (missing ones empty, the last
// one keeps any further separators).
std::vector<std::string_view> split_parts(const uint8_t* data, size_t size, size_t count);

// A directory of this process's own, made once and emptied by clear_dir().
const std::string& work_dir();
void clear_dir();
// `bytes` as the file `name` inside work_dir(); returns its path.
std::string write_file(const std::string& name, std::string_view bytes);

}  // namespace tide::fuzz
