#include "fuzz_check.h"

#include <cstdio>
#include <cstdlib>

namespace tide::fuzz {

void fault(const std::string& what) {
  std::fprintf(stderr, "tide fuzz fault: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

void expect_names(std::string_view message, std::string_view path) {
  if (message.find(path) == std::string_view::npos)
    fault("the error \"" + std::string(message) + "\" does not name " + std::string(path));
}

}  // namespace tide::fuzz
