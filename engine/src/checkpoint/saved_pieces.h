// Reading a checkpoint whatever layout saved it (internal): every rank's file lists the
// pieces it holds (docs/checkpoints.md, tide.pieces), and any parameter's or moment's
// whole tensor is put together from them.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "piece_list.h"
#include "tide/engine/io/safetensors.h"

namespace tide {

class SavedPieces {
 public:
  // Opens every file the manifest lists; throws naming the file when its piece list is
  // missing or wrong, or when the pieces of all files do not rebuild every tensor once
  // (piece_list.h).
  SavedPieces(std::string dir, const nlohmann::json& manifest);

  // The whole fp32 tensor of `param` of `kind` ("param", "exp_avg", "exp_avg_sq"), from
  // the pieces of every rank that saved it; throws when they do not cover it.
  at::Tensor whole(const std::string& param, const std::string& kind) const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::pair<std::string, std::string>, std::vector<SavedPiece>> sources_;
};

}  // namespace tide
