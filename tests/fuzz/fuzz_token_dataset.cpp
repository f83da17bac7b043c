// A prepared dataset directory a user points a run at: refused naming one of its files,
// or every split's ids lie below the vocabulary and its documents inside the split.
#include <cstdint>
#include <exception>
#include <vector>

#include "fuzz_check.h"
#include "fuzz_input.h"
#include "tide/engine/data/token_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tide;
  static const char* const kFiles[] = {"dataset.json", "train.bin", "train.idx", "val.bin", "val.idx"};
  fuzz::clear_dir();
  const auto parts = fuzz::split_parts(data, size, std::size(kFiles));
  for (size_t i = 0; i < parts.size(); ++i) fuzz::write_file(kFiles[i], parts[i]);
  try {
    const TokenDataset ds(fuzz::work_dir());
    const auto tokenizer = ds.tokenizer_path();
    if (tokenizer.rfind(fuzz::work_dir() + "/", 0) != 0 || tokenizer.find("/..") != std::string::npos)
      fuzz::fault("the tokenizer path " + tokenizer + " leaves the dataset directory");
    for (const char* name : {"train", "val"}) {
      const TokenSplit& split = ds.split(name);
      if (split.documents() < 0) fuzz::fault("a split with a negative document count");
      std::vector<int64_t> window(static_cast<size_t>(std::min<int64_t>(split.size(), 64)));
      if (!window.empty())
        split.copy(split.size() - static_cast<int64_t>(window.size()), static_cast<int64_t>(window.size()),
                   window.data());
      for (const int64_t id : window)
        if (id < 0 || id >= ds.vocab_size()) fuzz::fault("a verified split holds id " + std::to_string(id));
    }
  } catch (const std::exception& e) {
    fuzz::expect_names(e.what(), fuzz::work_dir());
  }
  return 0;
}
