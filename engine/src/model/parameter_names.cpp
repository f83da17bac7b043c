#include "tide/engine/model/parameter_names.h"

#include <cstdlib>

namespace tide {

int block_unit(const std::string& name) {
  for (const char* marker : {".layers.", ".h."}) {
    const auto at = name.find(marker);
    if (at == std::string::npos) continue;
    const char* digits = name.c_str() + at + std::char_traits<char>::length(marker);
    char* end = nullptr;
    const long index = std::strtol(digits, &end, 10);
    if (end != digits && *end == '.') return 1 + static_cast<int>(index);
  }
  return 0;
}

}  // namespace tide
