#include "tide/engine/io/std_binding.h"

#include <stdexcept>

#include <dlfcn.h>
#include <fmt/format.h>

namespace tide {

std::string library_defining(const char* symbol) {
  void* address = ::dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  if (address == nullptr || ::dladdr(address, &info) == 0 || info.dli_fname == nullptr) return "";
  return info.dli_fname;
}

void check_std_library_binding() {
  // std::filesystem::remove_all(const path&, std::error_code&): the call that crashed. Every
  // std symbol of tide's is looked up in the same order, so one stands for all of them.
  const char* symbol = "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathERSt10error_code";
  const std::string library = library_defining(symbol);
  const auto slash = library.rfind('/');
  const std::string name = slash == std::string::npos ? library : library.substr(slash + 1);
  if (library.empty() || name.rfind("libstdc++", 0) == 0 || name.rfind("libc++", 0) == 0) return;
  throw std::runtime_error(
      fmt::format("std::filesystem::remove_all resolves to {} instead of libstdc++: this binary was linked with that "
                  "library before libstdc++, and its copy of the standard library can crash tide (cmake/Linking.cmake; "
                  "docs/building.md)",
                  library));
}

}  // namespace tide
