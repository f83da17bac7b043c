// What a checkpoint records of the weights it leaves out (internal): a LoRA run's frozen
// base, which a resume or an export takes from the run's initial weights again.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tide/engine/model/weights_io.h"

namespace tide {

class TransformerImpl;

// XXH3 of the fp32 values of `names` (in sorted order) from `values`, 16 hex digits; ""
// for no names.
std::string weights_fingerprint(std::vector<std::string> names, const TensorSource& values);

// The fingerprint a checkpoint's manifest records of its frozen weights ("frozen_xxh3");
// "" where it records none (every weight trained, or a checkpoint from before LoRA).
std::string recorded_fingerprint(const nlohmann::json& manifest);

// The parameters of `model` that train not (require no gradient), by name.
std::vector<std::string> frozen_parameter_names(const TransformerImpl& model);

}  // namespace tide
