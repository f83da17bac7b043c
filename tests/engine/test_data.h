// A small prepared dataset written with the real `data prepare` code.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include "tide/engine/data/dataset_writer.h"

namespace tide::testing {

// Prepares (once per process) a byte-tokenised dataset of the license texts every
// Debian machine has, and returns its directory.
inline std::string small_dataset() {
  namespace fs = std::filesystem;
  static const std::string dir = [] {
    const fs::path root = fs::temp_directory_path() / ("tide_test_data_" + std::to_string(::getpid()));
    fs::remove_all(root);
    fs::create_directories(root / "text");
    int n = 0;
    for (const char* f : {"/usr/share/common-licenses/GPL-3", "/usr/share/common-licenses/Apache-2.0",
                          "/usr/share/common-licenses/MPL-2.0"})
      if (fs::exists(f)) fs::copy_file(f, root / "text" / (std::to_string(n++) + ".txt"));
    PrepareOptions opt;
    opt.inputs = {(root / "text").string()};
    opt.out_dir = (root / "ds").string();
    opt.tokenizer = "bytes";
    opt.val_fraction = 0.1;
    prepare_dataset(opt);
    return opt.out_dir;
  }();
  return dir;
}

}  // namespace tide::testing
