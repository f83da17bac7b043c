// What a parameter's Hugging Face name says about where it sits (no LibTorch).
#pragma once

#include <string>

namespace tide {

// The unit of a parameter from its name: 1 + the block index for names with a block
// path ("model.layers.3." / "transformer.h.3."), else 0.
int block_unit(const std::string& parameter_name);

}  // namespace tide
