#include "tide/engine/parallel/launch_env.h"

#include <cstdlib>
#include <stdexcept>

namespace tide {
namespace {
int int_var(const char* name, int fallback, int lo, int hi) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < lo || x > hi)
    throw std::invalid_argument(std::string("environment variable ") + name + "='" + v +
                                "' is not an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return static_cast<int>(x);
}
}  // namespace

std::optional<LaunchEnv> launch_env_from_environment() {
  if (!std::getenv("WORLD_SIZE")) return std::nullopt;
  LaunchEnv e;
  e.world = int_var("WORLD_SIZE", 1, 1, 1 << 20);
  e.rank = int_var("RANK", 0, 0, e.world - 1);
  e.local_rank = int_var("LOCAL_RANK", e.rank, 0, e.world - 1);
  e.master_port = int_var("MASTER_PORT", 29500, 1, 65535);
  if (const char* a = std::getenv("MASTER_ADDR"); a && *a) e.master_addr = a;
  return e;
}

}  // namespace tide
