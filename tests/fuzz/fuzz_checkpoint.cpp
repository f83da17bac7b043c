// A checkpoint directory handed to `tide ckpt verify` or a resume: the manifest is
// refused naming it, or every file it names stays in the directory, and verification
// reports problems rather than throwing. The manifest's size and hash of the rank file
// are set to the file's own when it names that file, so the file's header and piece list
// are reached (a corrupt file with its true hash: a writer's fault, not a bit flip).
#include <cstdint>
#include <exception>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "fuzz_check.h"
#include "fuzz_input.h"
#include "tide/engine/checkpoint/checkpoint_index.h"
#include "tide/engine/data/token_dataset.h"
#include "tide/engine/io/file_name.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tide;
  static const std::string kRankFile = "rank-00000.safetensors";
  fuzz::clear_dir();
  const auto parts = fuzz::split_parts(data, size, 2);
  const auto rank_file = fuzz::write_file(kRankFile, parts[1]);
  std::string manifest_text(parts[0]);
  auto manifest_json = parse_json_or_discard(manifest_text);
  if (manifest_json.is_object() && manifest_json.contains("files") && manifest_json["files"].is_object() &&
      manifest_json["files"].contains(kRankFile) && manifest_json["files"][kRankFile].is_object()) {
    manifest_json["files"][kRankFile]["bytes"] = static_cast<uint64_t>(parts[1].size());
    manifest_json["files"][kRankFile]["xxh3"] = xxh3_text(xxh3_of_file(rank_file));
    manifest_text = manifest_json.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  const auto manifest = fuzz::write_file("manifest.json", manifest_text);
  fuzz::write_file("COMMITTED", "");
  try {
    const auto j = read_manifest(fuzz::work_dir());
    for (const auto& [name, info] : j.at("files").items())
      if (!is_plain_file_name(name)) fuzz::fault("the manifest names " + name + ", outside its directory");
  } catch (const std::exception& e) {
    fuzz::expect_names(e.what(), manifest);
  }
  try {
    verify_checkpoint(fuzz::work_dir());
  } catch (const std::exception& e) {
    fuzz::fault(std::string("verify_checkpoint threw instead of reporting: ") + e.what());
  }
  return 0;
}
