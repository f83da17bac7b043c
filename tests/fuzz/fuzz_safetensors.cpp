// A safetensors file a user hands tide (an imported checkpoint, a rank's file): the reader
// either refuses it naming the file or every entry it lists lies inside the file.
#include <cstdint>
#include <exception>

#include "fuzz_check.h"
#include "fuzz_input.h"
#include "tide/engine/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tide;
  const auto path = fuzz::write_file("model.safetensors", {reinterpret_cast<const char*>(data), size});
  try {
    const SafetensorsReader reader(path);
    volatile uint8_t touched = 0;
    for (const auto& e : reader.entries()) {
      if (e.end < e.begin) fuzz::fault("entry " + e.name + " ends before it begins");
      uint64_t elements = 1;
      for (const int64_t d : e.shape) {
        if (d < 0) fuzz::fault("entry " + e.name + " has a negative dimension");
        elements *= static_cast<uint64_t>(d);
      }
      if (elements * safetensors_dtype_size(e.dtype) != e.end - e.begin)
        fuzz::fault("entry " + e.name + "'s byte range does not match its shape");
      // ASan finds a read outside the mapping.
      if (e.end > e.begin) touched = touched + reader.data(e)[0] + reader.data(e)[e.end - e.begin - 1];
      if (reader.find(e.name) == nullptr) fuzz::fault("entry " + e.name + " is listed but not found");
    }
  } catch (const std::exception& e) {
    fuzz::expect_names(e.what(), path);
  }
  return 0;
}
