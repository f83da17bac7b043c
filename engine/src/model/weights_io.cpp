#include "tide/engine/model/weights_io.h"

#include <stdexcept>
#include <utility>

#include <c10/util/accumulate.h>

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

WrittenFile stream_weights(const std::string& path, const std::vector<TensorShape>& tensors, const TensorSource& source,
                           const std::map<std::string, std::string>& metadata, const std::string& dtype) {
  torch::NoGradGuard no_grad;
  const auto type = scalar_type(dtype);
  const size_t width = safetensors_dtype_size(dtype);
  std::vector<SafetensorsEntry> entries;
  for (const auto& t : tensors) {
    SafetensorsEntry e;
    e.name = t.name;
    e.dtype = dtype;
    e.shape = t.shape;
    e.end = width * static_cast<uint64_t>(c10::multiply_integers(t.shape));
    entries.push_back(std::move(e));
  }
  SafetensorsStream out(path, std::move(entries), metadata);
  for (const auto& t : tensors) {
    const auto values = source(t.name).detach().to(torch::kCPU, type).contiguous();
    if (values.sizes().vec() != t.shape)
      throw std::runtime_error(path + ": tensor '" + t.name + "' of shape " + c10::str(c10::IntArrayRef(t.shape)) +
                               " was given values of shape " + c10::str(values.sizes()));
    out.write(t.name, values.data_ptr(), static_cast<size_t>(values.nbytes()));
  }
  return out.commit();
}

std::vector<std::pair<std::string, torch::Tensor>> weight_tensors(torch::nn::Module& model) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  for (const auto& item : model.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

void save_weights(const std::string& path, torch::nn::Module& model, const std::map<std::string, std::string>& metadata,
                  const std::string& dtype) {
  const auto held = weight_tensors(model);
  std::vector<TensorShape> tensors;
  std::map<std::string, torch::Tensor> by_name;
  for (const auto& [name, t] : held) {
    tensors.push_back({name, t.sizes().vec()});
    by_name[name] = t;
  }
  stream_weights(
      path, tensors, [&](const std::string& name) { return by_name.at(name); }, metadata, dtype);
}

WeightFiles::WeightFiles(const std::vector<std::string>& files,
                         const std::function<std::string(const std::string&)>& rename, std::string what)
    : what_(std::move(what)) {
  for (const auto& file : files) {
    files_.push_back(std::make_unique<SafetensorsReader>(file));
    for (const auto& e : files_.back()->entries()) {
      const std::string name = rename ? rename(e.name) : e.name;
      if (name.empty()) continue;
      if (!tensors_.emplace(name, std::make_pair(files_.back().get(), &e)).second)
        throw std::runtime_error(file + ": tensor '" + e.name + "' appears twice");
    }
  }
}

WeightFiles::~WeightFiles() = default;

std::vector<std::string> WeightFiles::names() const {
  std::vector<std::string> out;
  for (const auto& item : tensors_) out.push_back(item.first);
  return out;
}

torch::Tensor WeightFiles::read(const std::string& name, const std::vector<int64_t>& shape) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::runtime_error(what_ + " holds no tensor for parameter '" + name + "'");
  const auto& [file, entry] = it->second;
  if (!shape.empty() && entry->shape != shape)
    throw std::runtime_error(what_ + ": tensor '" + entry->name + "' has shape " +
                             c10::str(c10::IntArrayRef(entry->shape)) + ", the model's parameter has " +
                             c10::str(c10::IntArrayRef(shape)));
  ++reads_;
  auto values = read_weight(*file, *entry, what_);
  file->release(*entry);
  return values;
}

void load_weights(const std::vector<std::string>& files, torch::nn::Module& model,
                  const std::function<std::string(const std::string&)>& rename) {
  torch::NoGradGuard no_grad;
  const std::string what = files.size() == 1 ? files[0] : std::to_string(files.size()) + " files";
  const WeightFiles weights(files, rename, what);
  std::map<std::string, torch::Tensor> held;
  for (auto& [name, t] : weight_tensors(model)) held[name] = t;
  for (const auto& name : weights.names()) {
    const auto it = held.find(name);
    if (it == held.end()) throw std::runtime_error(what + ": tensor '" + name + "' has no parameter in this model");
    it->second.copy_(weights.read(name, it->second.sizes().vec()));
  }
  for (const auto& [name, t] : held)  // each tensor named a distinct parameter: only a missing one is left
    if (!weights.holds(name)) throw std::runtime_error(what + " holds no tensor for parameter '" + name + "'");
}

}  // namespace tide
