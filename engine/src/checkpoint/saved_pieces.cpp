#include "saved_pieces.h"

#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <torch/torch.h>

#include "tide/engine/io/json_input.h"

namespace tide {
namespace fs = std::filesystem;
using json = nlohmann::json;

SavedPieces::SavedPieces(std::string dir, const json& manifest) : dir_(std::move(dir)) {
  for (const auto& [name, info] : manifest["files"].items()) {
    files_.push_back(std::make_unique<SafetensorsReader>((fs::path(dir_) / name).string()));
    const auto& f = *files_.back();
    const auto it = f.metadata().find("tide.pieces");
    if (it == f.metadata().end()) throw std::runtime_error(fmt::format("{}: no tide.pieces metadata", f.path()));
    for (const auto& meta : parse_json_input(it->second, f.path() + ": tide.pieces metadata")) {
      const auto* e = f.find(meta.at("tensor").get<std::string>());
      if (!e) throw std::runtime_error(fmt::format("{}: tensor {} is missing", f.path(), meta.at("tensor").dump()));
      sources_[{meta.at("param").get<std::string>(), meta.at("kind").get<std::string>()}].push_back({&f, e, meta});
    }
  }
}

at::Tensor SavedPieces::whole(const std::string& param, const std::string& kind) const {
  const auto it = sources_.find({param, kind});
  if (it == sources_.end())
    throw std::runtime_error(fmt::format("checkpoint {} has no {} of parameter {}", dir_, kind, param));
  const auto& first = it->second.front().meta;
  auto out = torch::zeros(first.at("global_shape").get<std::vector<int64_t>>(), torch::kFloat32);
  std::map<int64_t, torch::Tensor> locals;  // by the tensor-parallel slice's first index
  int64_t filled = 0;
  for (const auto& s : it->second) {
    const int64_t slice_first = s.meta.at("tp").at("first").get<int64_t>();
    auto& local = locals[slice_first];
    if (!local.defined()) local = torch::zeros(s.meta.at("local_shape").get<std::vector<int64_t>>(), torch::kFloat32);
    const auto range = s.meta.at("range").get<std::vector<int64_t>>();
    const int64_t n = range[1] - range[0];
    TORCH_CHECK(static_cast<int64_t>(s.entry->end - s.entry->begin) == n * 4, s.file->path(), ": ", s.entry->name,
                " has the wrong size");
    std::memcpy(local.view({-1}).narrow(0, range[0], n).data_ptr<float>(), s.file->data(*s.entry),
                static_cast<size_t>(n) * 4);
    filled += n;
  }
  int64_t expected = 0;
  const auto& tp = first.at("tp");
  const int dim = tp.at("dim").get<int>();
  for (const auto& [slice_first, local] : locals) {
    expected += local.numel();
    if (dim < 0) {
      out.copy_(local);
      continue;
    }
    const int64_t n = std::min(local.size(dim), tp.at("valid").get<int64_t>() - slice_first);
    out.narrow(dim, slice_first, n).copy_(local.narrow(dim, 0, n));
  }
  if (filled != expected)
    throw std::runtime_error(
        fmt::format("checkpoint {}: the pieces of {} {} cover {} of {} elements", dir_, kind, param, filled, expected));
  return out;
}

}  // namespace tide
