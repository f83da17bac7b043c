// The checkpoint directory layout: listing, manifests, verification, durable writes.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "checkpoint_files.h"
#include "piece_list.h"
#include "tide/engine/checkpoint/checkpoint_index.h"
#include "tide/engine/io/file_name.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/io/safetensors.h"

namespace tide {
namespace fs = std::filesystem;

std::string step_dir_name(int64_t step) { return fmt::format("step-{:08d}", step); }
std::string rank_file_name(int rank, int part) {
  if (part == 0) return fmt::format("rank-{:05d}.safetensors", rank);
  return fmt::format("rank-{:05d}.{}.safetensors", rank, part);
}
std::string hex64(uint64_t x) { return fmt::format("{:016x}", x); }

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot open '{}' to flush it: {}", path, std::strerror(errno)));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) throw std::runtime_error(fmt::format("cannot flush '{}': {}", path, std::strerror(errno)));
}

void write_durably(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc | std::ios::binary);
    out << text;
    out.flush();
    if (!out) throw std::runtime_error(fmt::format("cannot write '{}'", tmp));
  }
  fsync_path(tmp);
  fs::rename(tmp, path);
  fsync_path(fs::path(path).parent_path().string());
}

namespace {
// The step of a directory named "step-" and at least 8 digits; -1 for any other name.
int64_t step_of(const std::string& name) {
  const std::string prefix = "step-";
  const size_t digits = name.size() - std::min(name.size(), prefix.size());
  if (digits < 8 || digits > 18 || name.compare(0, prefix.size(), prefix) != 0) return -1;
  int64_t step = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}
}  // namespace

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t step = step_of(e.path().filename().string());
    if (step < 0 || !e.is_directory(ec) || !fs::exists(e.path() / "COMMITTED", ec)) continue;
    out.push_back({step, e.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
  return out;
}

nlohmann::json read_manifest(const std::string& dir) {
  const auto path = (fs::path(dir) / "manifest.json").string();
  if (!fs::exists(path)) throw std::runtime_error(fmt::format("{}: missing", path));
  auto j = read_json_file(path);
  if (!j.is_object() || !j.contains("format") || !j.contains("files"))
    throw std::runtime_error(fmt::format("{}: not a tide checkpoint manifest", path));
  if (j["format"] != kCheckpointFormat)
    throw std::runtime_error(fmt::format("{}: format {} (this tide reads {})", path, j["format"].dump(),
                                         kCheckpointFormat));
  // Every file the manifest names is read or hashed: a name must stay in the directory.
  if (!j["files"].is_object()) throw std::runtime_error(fmt::format("{}: 'files' is not an object", path));
  for (const auto& [name, info] : j["files"].items()) {
    if (!is_plain_file_name(name))
      throw std::runtime_error(fmt::format("{}: file name {} leaves the checkpoint directory", path,
                                           nlohmann::json(name).dump()));
    if (!info.is_object() || !info.contains("bytes") || !info["bytes"].is_number_unsigned() ||
        !info.contains("xxh3") || !info["xxh3"].is_string())
      throw std::runtime_error(fmt::format("{}: the entry of {} needs 'bytes' (an integer) and 'xxh3' (a string)",
                                           path, name));
  }
  return j;
}

std::vector<std::string> verify_checkpoint(const std::string& dir, const Progress& progress) {
  std::vector<std::string> problems;
  std::vector<std::unique_ptr<SafetensorsReader>> files;  // the pieces point into them
  std::vector<SavedPiece> pieces;
  if (!fs::exists(fs::path(dir) / "COMMITTED"))
    problems.push_back(fmt::format("{}: no COMMITTED marker (the save did not finish)", dir));
  nlohmann::json manifest;
  try {
    manifest = read_manifest(dir);
  } catch (const std::exception& e) {
    problems.push_back(e.what());
    return problems;
  }
  // Bytes as the manifest counts them (unsigned: a manifest's sizes are not trusted to
  // add up); a file found missing or of another size counts as read.
  uint64_t total = 0, done = 0;
  for (const auto& [name, info] : manifest["files"].items()) total += info["bytes"].get<uint64_t>();
  const auto report = [&] {
    const auto clamp = [](uint64_t x) { return static_cast<int64_t>(std::min<uint64_t>(x, INT64_MAX)); };
    if (progress) progress("verifying", clamp(done), clamp(total));
  };
  report();
  for (const auto& [name, info] : manifest["files"].items()) {
    const auto path = (fs::path(dir) / name).string();
    const auto listed = info.at("bytes").get<uint64_t>();
    std::error_code ec;
    const auto size = fs::file_size(path, ec);
    if (ec || size != listed) {
      problems.push_back(ec ? fmt::format("{}: missing", path)
                            : fmt::format("{}: {} bytes, the manifest says {}", path, size, listed));
      done += listed;
      report();
      continue;
    }
    const std::string hash = hex64(xxh3_of_file(path, [&](uint64_t bytes) {
      done += bytes;
      report();
    }));
    if (hash != info.at("xxh3").get<std::string>()) {
      problems.push_back(fmt::format("{}: XXH3 {} differs from the manifest's {} (corrupt)", path, hash,
                                     info.at("xxh3").get<std::string>()));
      continue;
    }
    // The bytes are the ones written; they must also be a file every rank can read
    // (a header or a piece list written wrong): found here, every rank passes over this
    // checkpoint alike.
    try {
      auto file = std::make_unique<SafetensorsReader>(path);
      const auto in_file = read_piece_list(*file);
      pieces.insert(pieces.end(), in_file.begin(), in_file.end());
      files.push_back(std::move(file));
    } catch (const std::exception& e) {
      problems.push_back(e.what());
    }
  }
  if (!problems.empty()) return problems;
  try {
    check_piece_coverage(pieces, dir);
  } catch (const std::exception& e) {
    problems.emplace_back(e.what());
  }
  return problems;
}

}  // namespace tide
