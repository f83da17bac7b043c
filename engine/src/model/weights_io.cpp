#include "tide/engine/model/weights_io.h"

#include <set>
#include <stdexcept>

#include <torch/types.h>

namespace tide {
namespace {
torch::ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "F32") return torch::kFloat32;
  if (dtype == "F16") return torch::kFloat16;
  if (dtype == "BF16") return torch::kBFloat16;
  if (dtype == "F64") return torch::kFloat64;
  if (dtype == "I64") return torch::kInt64;
  if (dtype == "I32") return torch::kInt32;
  if (dtype == "I16") return torch::kInt16;
  if (dtype == "I8") return torch::kInt8;
  if (dtype == "U8") return torch::kUInt8;
  if (dtype == "BOOL") return torch::kBool;
  throw std::invalid_argument("unsupported safetensors dtype '" + dtype + "'");
}
}  // namespace

std::string safetensors_dtype(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32: return "F32";
    case torch::kFloat16: return "F16";
    case torch::kBFloat16: return "BF16";
    case torch::kFloat64: return "F64";
    case torch::kInt64: return "I64";
    case torch::kInt32: return "I32";
    case torch::kInt16: return "I16";
    case torch::kInt8: return "I8";
    case torch::kUInt8: return "U8";
    case torch::kBool: return "BOOL";
    default: throw std::invalid_argument(std::string("no safetensors dtype for ") + c10::toString(t.scalar_type()));
  }
}

torch::Tensor read_tensor(const SafetensorsReader& file, const SafetensorsEntry& e) {
  auto t = torch::empty(e.shape, torch::TensorOptions().dtype(scalar_type(e.dtype)));
  std::memcpy(t.data_ptr(), file.data(e), e.end - e.begin);
  return t;
}

torch::Tensor read_weight(const SafetensorsReader& file, const SafetensorsEntry& e, const std::string& path) {
  // Weights are floating point: an integer tensor cast to float would load values such
  // as 1e9 without a word.
  if (e.dtype != "F32" && e.dtype != "F16" && e.dtype != "BF16" && e.dtype != "F64")
    throw std::runtime_error(path + ": tensor '" + e.name + "' is " + e.dtype +
                             "; weights must be F32, F16, BF16 or F64");
  return read_tensor(file, e).to(torch::kFloat32);
}

void save_weights(const std::string& path, torch::nn::Module& model, const std::map<std::string, std::string>& metadata,
                  const std::string& dtype) {
  torch::NoGradGuard no_grad;
  const auto type = scalar_type(dtype);
  std::vector<torch::Tensor> keep;  // owns the bytes until write() returns
  SafetensorsWriter w;
  for (const auto& [k, v] : metadata) w.set_metadata(k, v);
  for (const auto& item : model.named_parameters()) {
    auto t = item.value().detach().to(torch::kCPU, type).contiguous();
    keep.push_back(t);
    w.add(item.key(), dtype, t.sizes().vec(), t.data_ptr(), static_cast<size_t>(t.nbytes()));
  }
  w.write(path);
}

void load_weights(const std::vector<std::string>& files, torch::nn::Module& model,
                  const std::function<std::string(const std::string&)>& rename) {
  torch::NoGradGuard no_grad;
  auto params = model.named_parameters();
  std::set<std::string> loaded;
  for (const auto& path : files) {
    const SafetensorsReader r(path);
    for (const auto& e : r.entries()) {
      const std::string name = rename ? rename(e.name) : e.name;
      if (name.empty()) continue;
      auto* p = params.find(name);
      if (!p) throw std::runtime_error(path + ": tensor '" + e.name + "' has no parameter in this model");
      if (p->sizes().vec() != e.shape)
        throw std::runtime_error(path + ": tensor '" + e.name + "' has shape " + c10::str(c10::IntArrayRef(e.shape)) +
                                 ", the model's parameter has " + c10::str(p->sizes()));
      if (!loaded.insert(name).second) throw std::runtime_error(path + ": tensor '" + e.name + "' appears twice");
      p->copy_(read_weight(r, e, path));
    }
  }
  for (const auto& item : params)
    if (!loaded.count(item.key()))
      throw std::runtime_error("parameter '" + item.key() + "' is missing from " +
                               (files.size() == 1 ? files[0] : std::to_string(files.size()) + " files"));
}

}  // namespace tide
