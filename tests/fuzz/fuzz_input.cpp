#include "fuzz_input.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace tide::fuzz {

std::vector<std::string_view> split_parts(const uint8_t* data, size_t size, size_t count) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < count) {
    const auto at = rest.find(kPartSeparator);
    if (at == std::string_view::npos) break;
    parts.push_back(rest.substr(0, at));
    rest.remove_prefix(at + kPartSeparator.size());
  }
  parts.push_back(rest);
  parts.resize(count);
  return parts;
}

const std::string& work_dir() {
  // Memory-backed where there is one: a fuzz target writes its files thousands of times
  // a second.
  // Never destroyed: the exit handler that removes it runs after static destructors. A
  // target that finds a fault aborts before that handler: run.sh gives the targets a
  // parent of its own (TIDE_FUZZ_DIR) and removes it.
  static const std::string& dir = *[] {
    const char* base = std::getenv("TIDE_FUZZ_DIR");
    if (!base) base = std::filesystem::is_directory("/dev/shm") ? "/dev/shm" : std::getenv("TMPDIR");
    auto* pattern = new std::string(std::string(base ? base : "/tmp") + "/tide-fuzz-XXXXXX");
    if (!mkdtemp(pattern->data())) throw std::runtime_error("cannot make a directory like " + *pattern);
    std::atexit([] { std::filesystem::remove_all(work_dir()); });
    return pattern;
  }();
  return dir;
}

void clear_dir() {
  for (const auto& e : std::filesystem::directory_iterator(work_dir())) std::filesystem::remove_all(e.path());
}

std::string write_file(const std::string& name, std::string_view bytes) {
  const std::string path = work_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.flush()) throw std::runtime_error("cannot write " + path);
  return path;
}

}  // namespace tide::fuzz
