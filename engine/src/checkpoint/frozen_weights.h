// What a checkpoint records of the weights it leaves out (internal): a LoRA run's frozen
// base, which a resume or an export takes from the run's initial weights again.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tide/engine/model/weights_io.h"

namespace tide {

class TransformerImpl;

// Parameter name -> XXH3 of its whole fp32 values, 16 hex digits. Of whole tensors, so
// that what a run of one layout (tensor and pipeline parallelism split and spread the
// frozen weights) records, a run or an export of any other can check.
using WeightFingerprints = std::map<std::string, std::string>;

std::string tensor_fingerprint(const at::Tensor& whole);
WeightFingerprints weights_fingerprints(const std::vector<std::string>& names, const TensorSource& whole);

// What a checkpoint's manifest records of its frozen weights ("frozen_xxh3"); empty where
// it records none (every weight trained).
WeightFingerprints recorded_fingerprints(const nlohmann::json& manifest);

// "" where each of `here` is recorded with the same fingerprint (and, with `all`, nothing
// else is recorded); else what differs first, by name.
std::string fingerprint_difference(const WeightFingerprints& recorded, const WeightFingerprints& here, bool all);

// The parameters of `model` that train not (require no gradient), by name.
std::vector<std::string> frozen_parameter_names(const TransformerImpl& model);

}  // namespace tide
