#include "tide/engine/io/std_binding.h"

#include <stdexcept>

#include <dlfcn.h>
#include <fmt/format.h>
#include <link.h>

namespace tide {
namespace {

std::string file_name_of(const std::string& path) {
  const auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// The path of the loaded object whose file name begins with `prefix`; empty where none is.
std::string loaded_object(const std::string& prefix) {
  struct Search {
    const std::string& prefix;
    std::string found;
  } search{prefix, {}};
  ::dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto& s = *static_cast<Search*>(data);
        const std::string path = info->dlpi_name ? info->dlpi_name : "";
        if (file_name_of(path).rfind(s.prefix, 0) != 0) return 0;
        s.found = path;
        return 1;
      },
      &search);
  return search.found;
}

}  // namespace

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
  const std::string name = file_name_of(library);
  if (library.empty() || name.rfind("libstdc++", 0) == 0 || name.rfind("libc++", 0) == 0) return;
  const std::string stdcxx = loaded_object("libstdc++.so");
  throw std::runtime_error(
      fmt::format("std::filesystem::remove_all resolves to {} instead of libstdc++: this binary was linked with that "
                  "library before libstdc++, and its copy of the standard library can crash tide (cmake/Linking.cmake; "
                  "docs/building.md). Until it is relinked, LD_PRELOAD={} puts libstdc++ first",
                  library, stdcxx.empty() ? "<the compiler's libstdc++.so.6>" : stdcxx));
}

}  // namespace tide
