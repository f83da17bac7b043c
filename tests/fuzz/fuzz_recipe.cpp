// A recipe a client submits, with its overrides: it loads into a configuration or is
// refused with a RecipeError, inside the sandbox's limits.
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "fuzz_input.h"
#include "tide/scripting/recipe.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tide;
  const auto parts = fuzz::split_parts(data, size, 2);
  std::vector<std::string> overrides;
  for (size_t at = 0; at < parts[1].size();) {
    const size_t end = std::min(parts[1].find('\n', at), parts[1].size());
    overrides.emplace_back(parts[1].substr(at, end - at));
    at = end + 1;
  }
  // Small limits: a fuzz run tries thousands of recipes a second.
  SandboxLimits limits;
  limits.instructions = 1'000'000;
  limits.seconds = 2.0;
  limits.memory_bytes = 64u << 20;
  try {
    Recipe r = Recipe::load_string(std::string(parts[0]), "fuzz.lua", overrides, limits);
    if (r.has_lr_function()) {
      try {
        r.lr_at(0);
        r.lr_at(1000);
      } catch (const RecipeError&) {
      }
    }
  } catch (const RecipeError&) {
  } catch (const std::exception& e) {
    fuzz::fault(std::string("a recipe failed with something other than a RecipeError: ") + e.what());
  }
  return 0;
}
