#include "tide/engine/train/local_device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>
#if __has_include(<c10/core/CachingDeviceAllocator.h>)
#include <ATen/DeviceAccelerator.h>
#endif

#include "tide/engine/model/transformer.h"
#include "tide/engine/parallel/distributed.h"
#include "tide/engine/plan/plan.h"
#include "tide/engine/train/flops.h"

namespace tide {

namespace {
template <typename F>
double best_seconds(int reps, F&& fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// One probe model: a small LLaMA whose time per token the planner predicts as matmul
// FLOPs at the matmul rate plus elementwise bytes at the elementwise rate (plan.h,
// token_cost).
struct ProbeShape {
  int64_t dim, layers, vocab, seq, batch;
};

struct ProbeTiming {
  double seconds, matmul_flops, elementwise_bytes;
};

// A probe model built, with its batch and its forward and backward pass.
struct Probe {
  ModelConfig model;
  ProbeShape shape;
  Transformer net{nullptr};
  torch::Tensor tokens;

  explicit Probe(const ProbeShape& p) : shape(p) {
    model.vocab_size = p.vocab;
    model.dim = p.dim;
    model.n_layers = p.layers;
    model.n_heads = p.dim / 64;
    model.n_kv_heads = std::max<int64_t>(1, model.n_heads / 2);
    model.multiple_of = 64;
    model.max_seq_len = p.seq;
    net = Transformer(model);
    net->reset_parameters(1);
    tokens = torch::randint(model.vocab_size, {p.batch, p.seq}, torch::kLong);
  }
  void pass() {
    net->zero_grad();
    net->loss(tokens, tokens).backward();
  }
};

// Each probe's median of seven forward and backward passes, the probes interleaved pass
// by pass: a shared machine's speed wanders within seconds, and interleaving lets the
// wander reach every probe alike instead of skewing one against another.
std::vector<ProbeTiming> time_probes(const std::vector<ProbeShape>& shapes) {
  std::vector<std::unique_ptr<Probe>> probes;
  for (const auto& shape : shapes) {
    probes.push_back(std::make_unique<Probe>(shape));
    probes.back()->pass();  // warm-up
  }
  std::vector<std::vector<double>> times(shapes.size());
  for (int round = 0; round < 7; ++round)
    for (size_t i = 0; i < probes.size(); ++i) times[i].push_back(best_seconds(1, [&] { probes[i]->pass(); }));
  std::vector<ProbeTiming> out;
  for (size_t i = 0; i < probes.size(); ++i) {
    auto& t = times[i];
    std::nth_element(t.begin(), t.begin() + 3, t.end());
    const auto& p = *probes[i];
    const TokenCost cost = token_cost(p.model, p.shape.seq, DType::Float32);
    const double n = static_cast<double>(p.shape.batch * p.shape.seq);
    out.push_back({t[3], n * cost.matmul_flops, n * cost.elementwise_bytes});
  }
  return out;
}

// The matmul rate R and elementwise rate W that best explain the probes' times
// t = F / R + B / W (least squares on relative errors), from shapes that weigh the two
// differently: one of the bundled tiny LLaMA's, one dominated by its logits, one by its
// matmuls.
std::pair<double, double> fit_rates() {
  const std::vector<ProbeShape> shapes = {{256, 2, 4096, 256, 4}, {128, 2, 16384, 256, 4}, {512, 2, 1024, 128, 8}};
  double aa = 0, ab = 0, bb = 0, at = 0, bt = 0;
  for (const ProbeTiming& t : time_probes(shapes)) {
    // Relative residuals: each probe's row divided by its time.
    const double a = t.matmul_flops / t.seconds, b = t.elementwise_bytes / t.seconds;
    aa += a * a;
    ab += a * b;
    bb += b * b;
    at += a;
    bt += b;
  }
  const double det = aa * bb - ab * ab;
  double x = (at * bb - bt * ab) / det, y = (aa * bt - ab * at) / det;  // 1/R, 1/W
  if (!(x > 0) || !(y > 0)) {
    // Degenerate (one kind of work explains everything): fit the other alone.
    x = std::max(x, 0.0);
    y = std::max(y, 0.0);
    if (x == 0) y = bt / bb;
    if (y == 0) x = at / aa;
  }
  return {x > 0 ? 1.0 / x : 1e15, y > 0 ? 1.0 / y : 1e15};
}
// Two ranks of one machine all-reducing through tide's own communicator (Gloo over
// loopback), each a thread here with its own process group: the bandwidth and latency
// of t = latency + bytes / bandwidth (a two-rank ring moves each byte once), from the
// medians of a small and a large all-reduce.
std::pair<double, double> probe_collectives(int port) {
  constexpr int64_t kSmall = int64_t{16} * 1024, kLarge = int64_t{2} * 1024 * 1024;  // fp32 elements
  std::vector<double> small, large;
  std::exception_ptr failed;
  auto rank = [&](int r) {
    try {
      LaunchEnv env;
      env.rank = env.local_rank = r;
      env.world = env.local_world = 2;
      env.master_port = port;
      env.launcher = "tide plan --calibrate";
      auto dist = init_distributed(env, ParallelConfig{}, std::chrono::seconds(60));
      for (const int64_t n : {kSmall, kLarge}) {
        auto t = torch::ones({n});
        dist->world->all_reduce_sum(t, "calibration warm-up");
        for (int i = 0; i < 7; ++i) {
          dist->world->barrier("calibration");
          const double s = best_seconds(1, [&] { dist->world->all_reduce_sum(t, "calibration"); });
          if (r == 0) (n == kSmall ? small : large).push_back(s);
        }
      }
    } catch (...) {
      failed = std::current_exception();
    }
  };
  std::thread peer(rank, 1);
  rank(0);
  peer.join();
  if (failed) std::rethrow_exception(failed);
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  const double ts = median(small), tl = median(large);
  const double bandwidth = 4.0 * static_cast<double>(kLarge - kSmall) / std::max(tl - ts, 1e-9);
  const double latency = std::max(0.0, ts - 4.0 * kSmall / bandwidth);
  return {bandwidth, latency};
}
}  // namespace

DeviceSpec probe_local_cpu(int threads) {
  const int before = at::get_num_threads();
  at::set_num_threads(std::max(1, threads));
  DeviceSpec d;
  d.name = "cpu";
  d.description = fmt::format("this machine's CPU, {} thread(s) per rank", threads);
  d.host = true;
  d.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  d.fp32_flops = measure_matmul_peak("cpu", DType::Float32);
  const auto [matmul_rate, elementwise_rate] = fit_rates();
  // The peak is the GEMM probe's, unless the model's own products ran faster (the machine
  // was busier during the GEMM probe).
  d.fp32_flops = std::max(d.fp32_flops, matmul_rate);
  d.bf16_flops = d.fp32_flops;  // bf16 runs no faster on most CPUs (compute_dtype.h)
  d.matmul_efficiency = matmul_rate / d.fp32_flops;
  d.memory_bandwidth = elementwise_rate;
  d.bandwidth_efficiency = 1.0;  // measured on the work itself
  // Gloo between processes of one machine: until a collective probe measures it, a
  // quarter of the elementwise rate each way.
  d.intra_node_bandwidth = d.memory_bandwidth / 4;
  d.inter_node_bandwidth = d.intra_node_bandwidth;
  d.host_link_bandwidth = d.memory_bandwidth;
  d.collective_latency = 100e-6;
  d.calibrated = true;
  at::set_num_threads(before);
  return d;
}

nlohmann::json calibrate_local_cpu(int rendezvous_port) {
  const int cores = local_cores();
  const auto [bandwidth, latency] = probe_collectives(rendezvous_port);
  nlohmann::json by_threads = nlohmann::json::object();
  for (const int threads : {1, cores}) {
    if (by_threads.contains(std::to_string(threads))) continue;
    DeviceSpec d = probe_local_cpu(threads);
    d.intra_node_bandwidth = d.inter_node_bandwidth = bandwidth;
    d.collective_latency = latency;
    by_threads[std::to_string(threads)] = to_json(d);
  }
  return {{"schema", "tide.calibration/1"}, {"cores", cores}, {"by_threads", by_threads}};
}

DeviceSpec local_cpu_device(const std::string& calibration_path, int ranks) {
  try {
    if (auto stored = stored_cpu_device(calibration_path, ranks)) return *stored;
  } catch (const std::exception& e) {
    spdlog::warn("ignoring the calibration {}: {}", calibration_path, e.what());
  }
  const int threads = std::max(1, local_cores() / std::max(1, ranks));
  spdlog::info("no calibration for {} thread(s) at {}: probing this CPU now (tide plan --calibrate stores it)", threads,
               calibration_path);
  return shared_cpu_device(probe_local_cpu(threads), ranks);
}

DeviceSpec local_cuda_device() {
  if (!torch::cuda::is_available()) throw std::runtime_error("device = \"cuda\", but LibTorch sees no CUDA device");
#if __has_include(<c10/core/CachingDeviceAllocator.h>)
  const double total = static_cast<double>(at::accelerator::getMemoryInfo(0).second);
  const DeviceSpec* nearest = nullptr;
  for (const auto& d : device_catalog())
    if (!nearest || std::abs(d.memory_bytes - total) < std::abs(nearest->memory_bytes - total)) nearest = &d;
  DeviceSpec d = *nearest;
  d.memory_bytes = total;
  d.description += fmt::format(" (the table's nearest to this GPU's {:.1f} GiB)", total / (1024.0 * 1024 * 1024));
  return d;
#else
  spdlog::warn("this LibTorch reports no device memory: planning for an h100-80");
  return find_device("h100-80");
#endif
}

}  // namespace tide
