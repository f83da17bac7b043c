// Model parameters ↔ safetensors files, by parameter name.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>

#include "tide/engine/io/safetensors.h"

namespace tide {

// A tensor to be written: its name and shape; its values come when its turn comes.
struct TensorShape {
  std::string name;
  std::vector<int64_t> shape;
};
// The values of the tensor named so (any floating dtype, any device), asked for one at a
// time and let go once written.
using TensorSource = std::function<torch::Tensor(const std::string& name)>;

// One safetensors file of `tensors` in their order, in `dtype` ("F32", "BF16", "F16"),
// each fetched from `source` as it is written: one tensor (and its converted copy) in
// memory at a time, whatever the model's size. Throws naming the tensor whose values
// do not have its shape; nothing is left at `path` then.
WrittenFile stream_weights(const std::string& path, const std::vector<TensorShape>& tensors, const TensorSource& source,
                           const std::map<std::string, std::string>& metadata, const std::string& dtype);

// What a weights file holds of `model`, in its order: every parameter, then every buffer
// (state that trains without gradients: the experts' routing biases).
std::vector<std::pair<std::string, torch::Tensor>> weight_tensors(torch::nn::Module& model);

// One safetensors file with every parameter (fp32 unless dtype is "BF16" / "F16").
void save_weights(const std::string& path, torch::nn::Module& model,
                  const std::map<std::string, std::string>& metadata = {}, const std::string& dtype = "F32");

// The tensors of weight files by the parameter each holds, read one at a time from the
// mapped files (a model too large to hold whole is converted through it). `rename` maps
// a file's tensor name to the parameter's (empty: drop the tensor); `what` names the
// weights in errors. Throws naming the file when a parameter's tensor appears twice.
class WeightFiles {
 public:
  WeightFiles(const std::vector<std::string>& files, const std::function<std::string(const std::string&)>& rename,
              std::string what);
  WeightFiles(const WeightFiles&) = delete;
  WeightFiles& operator=(const WeightFiles&) = delete;
  ~WeightFiles();

  // `name`'s values in fp32; throws naming the weights and the parameter when none is
  // there, or when its shape is not `shape` (given).
  torch::Tensor read(const std::string& name, const std::vector<int64_t>& shape = {}) const;
  size_t size() const { return tensors_.size(); }
  bool holds(const std::string& name) const { return tensors_.count(name) > 0; }
  std::vector<std::string> names() const;
  // Tensors read so far.
  size_t reads() const { return reads_; }

 private:
  std::string what_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, std::pair<const SafetensorsReader*, const SafetensorsEntry*>> tensors_;
  mutable size_t reads_ = 0;
};

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
