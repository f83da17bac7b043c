// tide ckpt list | verify | inspect | export: checkpoints from the command line.
#include <filesystem>
#include <iostream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli_common.h"
#include "tide/engine/checkpoint/checkpoint_index.h"
#include "tide/engine/io/json_input.h"
#include "tide/engine/io/safetensors.h"

namespace tide::cli {
namespace fs = std::filesystem;

namespace {
// A run directory's checkpoints folder, or the folder itself.
std::string checkpoints_root(const std::string& path) {
  return fs::is_directory(fs::path(path) / "checkpoints") ? (fs::path(path) / "checkpoints").string() : path;
}
}  // namespace

void add_checkpoint_command(CLI::App& app) {
  auto* ckpt = app.add_subcommand("ckpt", "List, verify, inspect and export checkpoints");
  ckpt->require_subcommand(1);
  struct Options {
    std::string path, out, dtype = "F32";
  };
  auto opt = std::make_shared<Options>();

  auto* list = ckpt->add_subcommand("list", "Committed checkpoints of a run, oldest first");
  list->add_option("run", opt->path, "Run directory or its checkpoints directory")->required();
  list->callback([opt] {
    const auto root = checkpoints_root(opt->path);
    const auto all = list_checkpoints(root);
    if (all.empty()) throw std::runtime_error(fmt::format("no committed checkpoint under {}", root));
    for (const auto& c : all) {
      const auto m = read_manifest(c.path);
      const auto& l = m["layout"];
      const int64_t chunks = l.value("virtual_stages", int64_t{1}), cp = l.value("cp", int64_t{1});
      const int64_t ep = l.value("ep", int64_t{1});
      std::cout << fmt::format("{}  step {}  tokens {}  layout dp{}{} x tp{} x pp{}{}{} ZeRO-{} ({} files)\n", c.path,
                               c.step, m["tokens_seen"].get<int64_t>(), l["dp"].get<int>(),
                               cp > 1 ? fmt::format(" x cp{}", cp) : "", l["tp"].get<int>(), l["pp"].get<int>(),
                               chunks > 1 ? fmt::format(" (v{})", chunks) : "", ep > 1 ? fmt::format(", ep{}", ep) : "",
                               l["zero"].get<int>(), m["files"].size());
    }
  });

  worker::add_verify_command(*ckpt, "verify");

  auto* inspect = ckpt->add_subcommand("inspect", "The manifest and each file's pieces");
  inspect->add_option("dir", opt->path, "A step directory")->required();
  inspect->callback([opt] {
    const auto m = read_manifest(opt->path);
    auto summary = m;
    summary.erase("recipe");
    std::cout << summary.dump(2) << "\n";
    for (const auto& [name, info] : m["files"].items()) {
      const SafetensorsReader f((fs::path(opt->path) / name).string());
      const auto pieces = parse_json_input(f.metadata().at("tide.pieces"), f.path() + ": tide.pieces metadata");
      int64_t elements = 0;
      for (const auto& p : pieces) elements += p["range"][1].get<int64_t>() - p["range"][0].get<int64_t>();
      std::cout << fmt::format("{}: {} pieces, {} values\n", name, pieces.size(), elements);
    }
  });

  worker::add_export_command(*ckpt, "export");
}

}  // namespace tide::cli
