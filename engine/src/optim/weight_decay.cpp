#include "tide/engine/optim/weight_decay.h"

namespace tide {

bool is_decayed(const std::string& name, const at::Tensor& param, bool decay_norms_and_biases,
                bool decay_embeddings) {
  const bool embedding = name.find("embed") != std::string::npos || name.find("word_embeddings.weight") != std::string::npos;
  if (param.dim() < 2) return decay_norms_and_biases;
  if (embedding) return decay_embeddings;
  return true;
}

}  // namespace tide
