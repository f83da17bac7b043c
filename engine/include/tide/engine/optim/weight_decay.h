// Which parameters AdamW decays.
#pragma once

#include <string>

#include <ATen/core/Tensor.h>

namespace tide {

// Whether AdamW decays this parameter, from its name and shape and the optimizer config:
// matrices yes, embeddings as decay_embeddings says, norms and biases (1-D) as
// decay_norms_and_biases says.
bool is_decayed(const std::string& name, const at::Tensor& param, bool decay_norms_and_biases, bool decay_embeddings);

}  // namespace tide
