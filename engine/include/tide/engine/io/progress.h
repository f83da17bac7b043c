// How a long job reports where it stands: progress(stage, done, total), in the stage's
// units (bytes, documents, merges), called as work proceeds. A caller shows it (a
// progress line, a daemon's job state); an empty function is allowed and costs nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace tide {

using Progress = std::function<void(const std::string& stage, int64_t done, int64_t total)>;

}  // namespace tide
