// A directory of this test process under the system's temporary directory, removed
// before and after use.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>

namespace tide::testing {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& stem)
      : path(std::filesystem::temp_directory_path() / (stem + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace tide::testing
