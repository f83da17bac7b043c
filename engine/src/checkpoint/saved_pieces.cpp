#include "saved_pieces.h"

#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <torch/types.h>

namespace tide {
namespace fs = std::filesystem;
using json = nlohmann::json;

SavedPieces::SavedPieces(std::string dir, const json& manifest) : dir_(std::move(dir)) {
  std::vector<SavedPiece> all;
  for (const auto& [name, info] : manifest["files"].items()) {
    files_.push_back(std::make_unique<SafetensorsReader>((fs::path(dir_) / name).string()));
    const auto pieces = read_piece_list(*files_.back());
    all.insert(all.end(), pieces.begin(), pieces.end());
  }
  check_piece_coverage(all, dir_);
  for (auto& p : all) sources_[{p.param, p.kind}].push_back(std::move(p));
}

at::Tensor SavedPieces::whole(const std::string& param, const std::string& kind) const {
  const auto it = sources_.find({param, kind});
  if (it == sources_.end())
    throw std::runtime_error(fmt::format("checkpoint {} has no {} of parameter {}", dir_, kind, param));
  // check_piece_coverage has checked that the pieces tile every slice and the slices
  // the parameter: what follows only places them.
  const SavedPiece& first = it->second.front();
  auto out = torch::zeros(first.global_shape, torch::kFloat32);
  std::map<int64_t, torch::Tensor> locals;  // by the tensor-parallel slice's first index
  for (const auto& p : it->second) {
    auto& local = locals[p.tp_first];
    if (!local.defined()) local = torch::zeros(p.local_shape, torch::kFloat32);
    const int64_t n = p.range_end - p.range_begin;
    std::memcpy(local.view({-1}).narrow(0, p.range_begin, n).data_ptr<float>(), p.file->data(*p.entry),
                static_cast<size_t>(n) * 4);
    p.file->release(*p.entry);  // copied: a resume or an export reads each piece once
  }
  for (const auto& [slice_first, local] : locals) {
    if (first.tp_dim < 0) {
      out.copy_(local);
      continue;
    }
    const int64_t n = std::min(local.size(first.tp_dim), first.tp_valid - slice_first);
    out.narrow(first.tp_dim, slice_first, n).copy_(local.narrow(first.tp_dim, 0, n));
  }
  return out;
}

}  // namespace tide
