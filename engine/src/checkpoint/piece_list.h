// The pieces a checkpoint's rank files list in their tide.pieces metadata
// (docs/checkpoints.md), read and checked without LibTorch (internal): the resume
// (SavedPieces) and `verify_checkpoint` trust nothing of a file before these checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tide/engine/io/safetensors.h"

namespace tide {

struct SavedPiece {
  const SafetensorsReader* file = nullptr;
  const SafetensorsEntry* entry = nullptr;  // 1-D F32, range_end - range_begin values
  std::string param, kind;                  // kind: "param", "exp_avg", "exp_avg_sq" or "buffer"
  std::vector<int64_t> global_shape, local_shape;
  int64_t tp_dim = -1, tp_first = 0, tp_length = 0, tp_valid = 0;
  int64_t range_begin = 0, range_end = 0;  // row-major elements of the local slice
};

// The pieces of one rank file, each checked against the format and the file's tensors;
// throws naming the file, the piece and the value.
std::vector<SavedPiece> read_piece_list(const SafetensorsReader& file);

// Throws unless, for each parameter and kind, the pieces of `all` agree on the shapes
// and the tensor-parallel split, their slices tile [0, valid) along tp_dim, and each
// slice's pieces tile its elements once: the whole tensor can be rebuilt, every value
// from exactly one piece. `dir` names the checkpoint in errors.
void check_piece_coverage(const std::vector<SavedPiece>& all, const std::string& dir);

}  // namespace tide
