// What the planner knows of a machine: one device's memory, peaks and links, from a
// bundled table of data-centre GPUs, from the local machine's calibration, or from both
// (a calibration of the same device kind overrides the table's assumed efficiencies).
// No LibTorch: `tide plan` answers in milliseconds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace tide {

struct DeviceSpec {
  std::string name;                       // "h100-80"
  std::string description;                // "NVIDIA H100 SXM 80GB"
  double memory_bytes = 0;                // what tensors may use of one device (the host's RAM for "cpu")
  double bf16_flops = 0, fp32_flops = 0;  // dense matmul peaks, FLOP/s (MFU's denominators)
  double memory_bandwidth = 0;            // device memory, bytes/s
  double intra_node_bandwidth = 0;        // per device and direction between devices of a node, bytes/s
  double inter_node_bandwidth = 0;        // per device and direction between nodes, bytes/s
  double host_link_bandwidth = 0;         // device <-> host memory (optimizer offload), bytes/s
  double collective_latency = 0;          // seconds added to every collective (launch, synchronisation)
  // Seconds each operator costs beyond its arithmetic (dispatch, a kernel launch): what
  // makes many small micro-batches slower than few large ones.
  double op_overhead = 10e-6;
  // The fraction of its peak a training step's matmuls reach on this device, and of its
  // memory bandwidth the elementwise work reaches: assumed for the table's GPUs (from
  // published measurements), measured by `tide plan --calibrate` for the local machine.
  double matmul_efficiency = 0.7, bandwidth_efficiency = 0.7;
  // The bf16 products' share of the bf16 peak where it was measured apart from fp32's (a
  // CPU's calibration: its bf16 GEMMs and the elementwise work around them scale unlike
  // fp32's). 0: matmul_efficiency, as for the table's GPUs.
  double bf16_matmul_efficiency = 0;
  // How much faster a rank computes while the other ranks of its machine wait than while
  // they compute too (at least 1): a CPU's ranks share its caches, memory bandwidth and,
  // on a loaded machine, its free cores. Measured by `tide plan --calibrate` for one-thread
  // ranks; 1 for devices of their own. Pipeline stages gain it in their fill, drain and slack.
  double idle_peer_speedup = 1;
  // Fused causal attention's rate, forward and backward, in the FLOPs the time model
  // counts for it: measured on a CPU by `tide plan --calibrate`, where the kernel runs far
  // below the GEMMs and gains little from bf16 (on this project's EPYC: 1.1x, against 4x
  // for the GEMMs). 0: the matmul rate (the GPUs of the table: flash kernels run near it).
  double attention_fp32_flops = 0, attention_bf16_flops = 0;
  // Device memory the runtime holds beyond tensors (CUDA context, library workspaces)
  // and the share of tensor memory the caching allocator loses to fragmentation.
  double runtime_bytes = 0;
  double fragmentation = 0.0;
  // The attention kernel the device's stack runs: fused (flash / memory-efficient
  // kernels, what tide's scaled_dot_product_attention gets: causal blocks skipped, no
  // T x T tensor stored) or materialised (scores and probabilities written out, kept for
  // backward and read back: the math path, and stacks before FlashAttention such as
  // Megatron-LM's 2021 runs). `tide plan --attention materialized` models the latter.
  bool fused_attention = true;
  bool host = false;        // the CPU: "device" memory is host memory
  bool calibrated = false;  // figures measured on this machine (tide plan --calibrate)
};

struct Cluster {
  DeviceSpec device;
  int nodes = 1;
  int devices_per_node = 1;
  int world() const { return nodes * devices_per_node; }
};

// The bundled table: h100-80, h100-96, h200, a100-40, a100-80, l40s. `cpu` is not in it: the
// local machine is described by calibrate_local_device() (needs LibTorch, tide's CLI).
const std::vector<DeviceSpec>& device_catalog();
// Throws std::invalid_argument naming the device and the known ones.
DeviceSpec find_device(const std::string& name);
// A device described in a JSON file with the fields of to_json(DeviceSpec): a GPU the
// table lacks, or a stack's figures measured elsewhere. Throws std::invalid_argument
// naming the file and what is wrong with it.
DeviceSpec device_from_file(const std::string& path);

// The local CPU, shared by `ranks` processes of cores / ranks threads each (at least one):
// from the calibration `tide plan --calibrate` stored at `path` (nullopt when it holds
// none for that thread count; a corrupt file throws), or from nominal per-core figures.
// (train/local_device.h probes the machine when nothing is stored.)
std::optional<DeviceSpec> stored_cpu_device(const std::string& path, int ranks);
// The matmul peak, fp32 or bf16, that the calibration stored at `path` measured for a
// rank of `threads` threads (beside busy ranks on the other cores where it has one
// thread): nullopt where none is stored (a corrupt file throws).
std::optional<double> stored_matmul_peak(const std::string& path, int threads, bool bf16);
// `d` measured with cores / ranks threads, as each of `ranks` processes sees it.
DeviceSpec shared_cpu_device(DeviceSpec d, int ranks);
DeviceSpec nominal_cpu_device(int ranks);
// $XDG_CACHE_HOME/tide/calibration-cpu.json, or ~/.cache/tide/calibration-cpu.json.
std::string default_calibration_path();
// Cores this process may run on: its affinity mask (taskset, a Slurm or container cpuset),
// not every core of the host. The planner, the ranks' threads and tided's slots all count
// these.
int local_cores();

nlohmann::json to_json(const DeviceSpec& d);
DeviceSpec device_from_json(const nlohmann::json& j);

}  // namespace tide
