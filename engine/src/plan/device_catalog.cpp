#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tide/engine/io/json_input.h"
#include "tide/engine/plan/cluster.h"

namespace tide {

namespace {
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

// Peaks and link rates from the vendors' data sheets (dense, no sparsity); link figures
// are what NCCL's bus bandwidth reaches on them (nccl-tests), not the nominal rate; memory
// is what nvidia-smi reports. The efficiencies are assumptions the calibration replaces:
// a training step's GEMMs reach about 70% of the bf16 peak on Hopper and Ampere
// (an 8192^3 product 80%: 790 of 989 TFLOP/s measured on an H100 for this project).
DeviceSpec gpu(std::string name, std::string description, double memory_mib, double bf16_tflops, double fp32_tflops,
               double hbm_gbps, double intra_gbps, double inter_gbps, double host_gbps) {
  DeviceSpec d;
  d.name = std::move(name);
  d.description = std::move(description);
  d.memory_bytes = memory_mib * kMiB;
  d.bf16_flops = bf16_tflops * 1e12;
  d.fp32_flops = fp32_tflops * 1e12;
  d.memory_bandwidth = hbm_gbps * 1e9;
  d.intra_node_bandwidth = intra_gbps * 1e9;
  d.inter_node_bandwidth = inter_gbps * 1e9;
  d.host_link_bandwidth = host_gbps * 1e9;
  d.collective_latency = 30e-6;
  d.op_overhead = 5e-6;  // a kernel launch, no CUDA graph
  d.matmul_efficiency = 0.7;
  d.bandwidth_efficiency = 0.8;
  d.runtime_bytes = 1.0 * kGiB;  // CUDA context, cuBLAS / cuDNN workspaces, NCCL buffers
  d.fragmentation = 0.05;        // the caching allocator's reserved-but-unused share
  return d;
}
}  // namespace

const std::vector<DeviceSpec>& device_catalog() {
  static const std::vector<DeviceSpec> catalog = {
      // NVLink 4 (900 GB/s both ways), NDR 400 Gb/s per GPU, PCIe 5.
      gpu("h100-80", "NVIDIA H100 SXM 80GB", 81559, 989, 67, 3350, 360, 42, 50),
      // The 96 GB part of Meta's clusters (HBM3, run at 500 W: torchtitan's published
      // H100 runs); its memory scaled from the 80 GB part's reported size.
      gpu("h100-96", "NVIDIA H100 SXM 96GB", 97871, 989, 67, 3350, 360, 42, 50),
      gpu("h200", "NVIDIA H200 SXM 141GB", 143771, 989, 67, 4800, 360, 42, 50),
      // NVLink 3 (600 GB/s both ways), HDR 200 Gb/s per GPU (Selene), PCIe 4.
      gpu("a100-40", "NVIDIA A100 SXM 40GB", 40536, 312, 19.5, 1555, 230, 22, 24),
      gpu("a100-80", "NVIDIA A100 SXM 80GB", 81251, 312, 19.5, 2039, 230, 22, 24),
      // No NVLink: peers talk over PCIe 4; 200 Gb/s between nodes.
      gpu("l40s", "NVIDIA L40S 48GB (PCIe)", 46068, 362, 91.6, 864, 20, 20, 24),
  };
  return catalog;
}

DeviceSpec find_device(const std::string& name) {
  std::string known;
  for (const auto& d : device_catalog()) {
    if (d.name == name) return d;
    known += (known.empty() ? "" : ", ") + d.name;
  }
  throw std::invalid_argument(fmt::format(
      "unknown device '{}' (known: {}, cpu for this machine, or a .json file describing one)", name, known));
}

DeviceSpec device_from_file(const std::string& path) {
  constexpr std::streamoff kMaxBytes = 1 << 20;  // a description is a few hundred bytes
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument(fmt::format("device file '{}' cannot be read", path));
  in.seekg(0, std::ios::end);
  if (in.tellg() > kMaxBytes)
    throw std::invalid_argument(
        fmt::format("device file '{}' holds {} bytes; 1 MiB at most", path, static_cast<long long>(in.tellg())));
  in.seekg(0);
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = parse_json_input(text.str(), "device file '" + path + "'");
  } catch (const std::exception& e) {
    throw std::invalid_argument(e.what());  // names the file already
  }
  try {
    return device_from_json(j);
  } catch (const std::exception& e) {
    throw std::invalid_argument(fmt::format("device file '{}': {}", path, e.what()));
  }
}

nlohmann::json to_json(const DeviceSpec& d) {
  return {{"name", d.name},
          {"description", d.description},
          {"memory_bytes", d.memory_bytes},
          {"bf16_flops", d.bf16_flops},
          {"fp32_flops", d.fp32_flops},
          {"memory_bandwidth", d.memory_bandwidth},
          {"intra_node_bandwidth", d.intra_node_bandwidth},
          {"inter_node_bandwidth", d.inter_node_bandwidth},
          {"host_link_bandwidth", d.host_link_bandwidth},
          {"collective_latency", d.collective_latency},
          {"op_overhead", d.op_overhead},
          {"matmul_efficiency", d.matmul_efficiency},
          {"bandwidth_efficiency", d.bandwidth_efficiency},
          {"bf16_matmul_efficiency", d.bf16_matmul_efficiency},
          {"idle_peer_speedup", d.idle_peer_speedup},
          {"attention_fp32_flops", d.attention_fp32_flops},
          {"attention_bf16_flops", d.attention_bf16_flops},
          {"runtime_bytes", d.runtime_bytes},
          {"fragmentation", d.fragmentation},
          {"fused_attention", d.fused_attention},
          {"host", d.host},
          {"calibrated", d.calibrated}};
}

DeviceSpec device_from_json(const nlohmann::json& j) {
  DeviceSpec d;
  d.name = j.at("name").get<std::string>();
  d.description = j.value("description", d.name);
  d.memory_bytes = j.at("memory_bytes").get<double>();
  d.bf16_flops = j.at("bf16_flops").get<double>();
  d.fp32_flops = j.at("fp32_flops").get<double>();
  d.memory_bandwidth = j.at("memory_bandwidth").get<double>();
  d.intra_node_bandwidth = j.at("intra_node_bandwidth").get<double>();
  d.inter_node_bandwidth = j.at("inter_node_bandwidth").get<double>();
  d.host_link_bandwidth = j.at("host_link_bandwidth").get<double>();
  d.collective_latency = j.value("collective_latency", 0.0);
  d.op_overhead = j.value("op_overhead", d.op_overhead);
  d.matmul_efficiency = j.at("matmul_efficiency").get<double>();
  d.bandwidth_efficiency = j.at("bandwidth_efficiency").get<double>();
  d.bf16_matmul_efficiency = j.value("bf16_matmul_efficiency", 0.0);
  if (d.bf16_matmul_efficiency < 0 || d.bf16_matmul_efficiency > 1)
    throw std::invalid_argument(
        fmt::format("device '{}': bf16_matmul_efficiency {} is outside [0, 1]", d.name, d.bf16_matmul_efficiency));
  d.attention_fp32_flops = j.value("attention_fp32_flops", 0.0);
  d.attention_bf16_flops = j.value("attention_bf16_flops", 0.0);
  if (d.attention_fp32_flops < 0 || d.attention_bf16_flops < 0)
    throw std::invalid_argument(fmt::format("device '{}': an attention rate is negative", d.name));
  d.idle_peer_speedup = j.value("idle_peer_speedup", 1.0);
  if (!(d.idle_peer_speedup >= 1))
    throw std::invalid_argument(
        fmt::format("device '{}': idle_peer_speedup {} is below 1", d.name, d.idle_peer_speedup));
  d.runtime_bytes = j.value("runtime_bytes", 0.0);
  d.fragmentation = j.value("fragmentation", 0.0);
  d.fused_attention = j.value("fused_attention", true);
  d.host = j.value("host", false);
  d.calibrated = j.value("calibrated", false);
  for (const double v : {d.memory_bytes, d.bf16_flops, d.fp32_flops, d.memory_bandwidth, d.intra_node_bandwidth,
                         d.matmul_efficiency, d.bandwidth_efficiency})
    if (!(v > 0)) throw std::invalid_argument(fmt::format("device '{}': a figure is not positive ({})", d.name, v));
  for (const double e : {d.matmul_efficiency, d.bandwidth_efficiency})
    if (e > 1) throw std::invalid_argument(fmt::format("device '{}': an efficiency exceeds 1 ({})", d.name, e));
  return d;
}

}  // namespace tide
