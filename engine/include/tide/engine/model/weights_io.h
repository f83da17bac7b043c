// Model parameters ↔ safetensors files, by parameter name.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "tide/engine/io/safetensors.h"

namespace tide {

// One safetensors file with every parameter (fp32 unless dtype is "BF16" / "F16").
void save_weights(const std::string& path, torch::nn::Module& model,
                  const std::map<std::string, std::string>& metadata = {}, const std::string& dtype = "F32");

// Copies tensors from the files into the model's parameters, converting dtypes. Every
// parameter must be found exactly once with its shape; tensors the model does not have
// are errors too. `rename` maps a file's tensor name to the model's (empty: drop it).
void load_weights(const std::vector<std::string>& files, torch::nn::Module& model,
                  const std::function<std::string(const std::string&)>& rename = {});

// A CPU tensor that owns a copy of the entry's data.
torch::Tensor read_tensor(const SafetensorsReader& file, const SafetensorsEntry& e);
// read_tensor of a weight, in fp32; throws naming `path` and the tensor unless the
// entry is floating point.
torch::Tensor read_weight(const SafetensorsReader& file, const SafetensorsEntry& e, const std::string& path);

std::string safetensors_dtype(const torch::Tensor& t);

}  // namespace tide
