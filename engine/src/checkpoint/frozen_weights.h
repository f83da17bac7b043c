// What a checkpoint records of the weights it leaves out (internal): a LoRA run's frozen
// base, which a resume or an export takes from the run's initial weights again.
#pragma once

#include <string>
#include <vector>

#include "tide/engine/model/weights_io.h"

namespace tide {

class TransformerImpl;

// XXH3 of the fp32 values of `names` (in sorted order) from `values`, 16 hex digits; ""
// for no names.
std::string weights_fingerprint(std::vector<std::string> names, const TensorSource& values);

// The parameters of `model` that train not (require no gradient), by name.
std::vector<std::string> frozen_parameter_names(const TransformerImpl& model);

}  // namespace tide
