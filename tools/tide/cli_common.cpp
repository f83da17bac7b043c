#include "cli_common.h"

namespace tide::cli {

void add_overrides(CLI::App& cmd, std::vector<std::string>& overrides) {
  cmd.add_option("--set", overrides, "Override a recipe field, e.g. --set optimizer.lr=1e-4 (repeatable)")
      ->type_name("KEY=VALUE");
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

}  // namespace tide::cli
