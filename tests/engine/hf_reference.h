// What the tests that compare tide with the real transformers share: running
// tests/engine/hf_reference.py in the project's .venv, reading its safetensors, and the
// bound on two fp32 evaluations of the same logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <torch/types.h>

#include "tide/engine/io/safetensors.h"
#include "tide/engine/model/transformer.h"
#include "tide/engine/model/weights_io.h"

namespace tide::testing {

inline void run_hf_reference(const std::string& args) {
  const std::string cmd =
      std::string(TIDE_PYTHON) + " " + TIDE_SOURCE_DIR + "/tests/engine/hf_reference.py " + args + " 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

inline torch::Tensor read_named(const SafetensorsReader& f, const std::string& name) {
  const SafetensorsEntry* e = f.find(name);
  if (!e) throw std::runtime_error(f.path() + " has no " + name);
  return read_tensor(f, *e);
}

// How far two fp32 evaluations of the same logits may lie apart when they differ only in
// the order of their sums (tide's kernels against transformers'). A sum of K terms in
// fp32 is off by at most K u times the sum of the terms' magnitudes (u = 2^-24); the
// longest chain from the ids to a logit passes D = 4 per block + 2 such sums, the longest
// of which adds K = max(dim, ffn, positions) terms. With weights drawn at random the
// terms' signs are random, so their magnitudes sum to about sqrt(K) times the result:
// the bound is D K u sqrt(K) times the largest logit.
inline double logit_tolerance(const ModelConfig& m, int64_t positions, const torch::Tensor& logits) {
  const double u = std::ldexp(1.0, -24);
  const double K = static_cast<double>(std::max({m.dim, resolved_ffn_dim(m), positions}));
  // A mixture of experts sums its top-k experts' outputs too: k more roundings a layer.
  const double D =
      (4.0 + static_cast<double>(m.moe_experts > 0 ? m.moe_top_k : 0)) * static_cast<double>(m.n_layers) + 2.0;
  return D * K * u * std::sqrt(K) * logits.abs().max().item<double>();
}

}  // namespace tide::testing
