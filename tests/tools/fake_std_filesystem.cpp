// Preloaded, this library defines std::filesystem::remove_all ahead of libstdc++, as
// PyTorch 2.11's wheels did for binaries that needed them first: the shape of process
// that a run must refuse to start in (tests/tools/std_binding_guard_test.sh).
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace std::filesystem {
std::uintmax_t remove_all(const path&, std::error_code&) { std::abort(); }
}  // namespace std::filesystem
