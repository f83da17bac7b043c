#include "tide/engine/io/std_binding.h"

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>

#include <dlfcn.h>
#include <fmt/format.h>
#include <link.h>
#include <sys/stat.h>

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

void check_std_library_binding() {
  // std::filesystem::remove_all(const path&, std::error_code&), the call that crashed, as
  // this binary's code reaches it: the address comes from the same relocation the calls
  // take (position-independent code reads it from the GOT), so dladdr names the file the
  // dynamic linker bound them to. Every std symbol of tide's was bound in the same order.
  using RemoveAll = std::uintmax_t (*)(const std::filesystem::path&, std::error_code&);
  const RemoveAll remove_all = &std::filesystem::remove_all;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<const void*>(remove_all), &info) == 0 || info.dli_fname == nullptr) return;
  const std::string library = info.dli_fname;
  const std::string name = file_name_of(library);
  if (name.rfind("libstdc++", 0) == 0 || name.rfind("libc++", 0) == 0) return;
  // A program linked with a static libstdc++ (an embedding one, say) holds its own. (POSIX
  // here: std::filesystem may be the very copy in question.)
  struct stat defining = {};
  struct stat program = {};
  if (::stat(library.c_str(), &defining) == 0 && ::stat("/proc/self/exe", &program) == 0 &&
      defining.st_dev == program.st_dev && defining.st_ino == program.st_ino)
    return;
  const std::string stdcxx = loaded_object("libstdc++.so");
  throw std::runtime_error(
      fmt::format("std::filesystem::remove_all resolves to {} instead of libstdc++: this binary was linked with that "
                  "library before libstdc++, and its copy of the standard library can crash tide (cmake/Linking.cmake; "
                  "docs/building.md). Until it is relinked, LD_PRELOAD={} puts libstdc++ first",
                  library, stdcxx.empty() ? "<the compiler's libstdc++.so.6>" : stdcxx));
}

}  // namespace tide
