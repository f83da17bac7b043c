// One model twice, the second with activation checkpointing (of the first
// `recompute_blocks` blocks; 0: all), each run through one forward and backward on the
// same tokens from the same random state (dropout draws the same masks in both only if
// recomputation replays them).
#pragma once

#include <torch/types.h>

#include "tide/engine/model/transformer.h"

namespace tide::testing {

struct RecomputePair {
  Transformer plain{nullptr}, checkpointed{nullptr};
  double plain_loss = 0, checkpointed_loss = 0;
};

inline RecomputePair with_and_without_recompute(const ModelConfig& config, torch::Device device,
                                                int64_t recompute_blocks = 0) {
  ModelConfig ckpt = config;
  ckpt.activation_checkpointing = true;
  ckpt.recompute_blocks = recompute_blocks;
  RecomputePair p{Transformer(config), Transformer(ckpt)};
  const auto tokens = torch::randint(0, config.vocab_size, {2, 16}, torch::kInt64).to(device);
  const auto targets = torch::randint(0, config.vocab_size, {2, 16}, torch::kInt64).to(device);
  for (Transformer* m : {&p.plain, &p.checkpointed}) {
    (*m)->reset_parameters(9);
    (*m)->to(device);
    (*m)->train();
    torch::manual_seed(77);
    const auto loss = (*m)->loss(tokens, targets);
    loss.backward();
    (m == &p.plain ? p.plain_loss : p.checkpointed_loss) = loss.item<double>();
  }
  return p;
}

}  // namespace tide::testing
