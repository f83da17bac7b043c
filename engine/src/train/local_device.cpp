#include "tide/engine/train/local_device.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include <unistd.h>

#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/cuda.h>
#include <torch/types.h>
#include <nlohmann/json.hpp>
#if __has_include(<c10/core/CachingDeviceAllocator.h>)
#include <ATen/DeviceAccelerator.h>
#endif

#include "tide/engine/model/compute_dtype.h"
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
  double seconds, matmul_flops, attention_flops, elementwise_bytes;
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
  ~Probe() { drop_working_copies(this); }
  Probe(const Probe&) = delete;
  Probe& operator=(const Probe&) = delete;
  // With `compute` bf16 the matmuls run as a one-process training step runs them: with
  // the weights' bf16 copies the optimizer keeps (adamw.h: keep_working_copy), no cast.
  void pass(DType compute = DType::Float32) {
    if (compute != DType::Float32 && !copies_kept) {
      std::vector<StandingCopy> copies;
      for (const auto& p : net->parameters()) copies.push_back({p, p.detach().to(scalar_type_of(compute))});
      keep_working_copies(this, {}, copies);
      copies_kept = true;
    }
    net->zero_grad();
    with_compute_dtype(compute, [&] { return net->loss(tokens, tokens); }).backward();
  }

 private:
  bool copies_kept = false;
};

// Fused causal attention, forward and backward, at the probes' head width and length
// (64, 256) in `dtype`; `flops` as the time model counts them (token_cost).
struct AttentionProbe {
  torch::Tensor q, k, v, grad;
  double flops;

  explicit AttentionProbe(DType dtype) {
    const auto opts = torch::TensorOptions().dtype(scalar_type_of(dtype));
    const int64_t batch = 4, heads = 4, seq = 256, head_dim = 64;
    q = torch::randn({batch, heads, seq, head_dim}, opts).requires_grad_();
    k = torch::randn({batch, heads, seq, head_dim}, opts).requires_grad_();
    v = torch::randn({batch, heads, seq, head_dim}, opts).requires_grad_();
    grad = torch::randn({batch, heads, seq, head_dim}, opts);
    flops = 12.0 * 0.5 * static_cast<double>(heads * head_dim * seq * batch * seq);
  }
  void pass() {
    const auto out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
    torch::autograd::grad({out}, {q, k, v}, {grad});
  }
};

struct ProbeTimings {
  std::vector<ProbeTiming> models;
  ProbeTiming bf16_model;                         // the first model (time_probes), in bf16
  double attention_fp32 = 0, attention_bf16 = 0;  // FLOP/s
};

// Each probe's median of seven passes, the probes (the models, the first of them again in
// bf16, and attention in fp32 and bf16) interleaved pass by pass: a shared machine's speed
// wanders within seconds, and interleaving lets the wander reach every probe alike instead
// of skewing one against another. A probe whose warm-up pass took over a second is timed in
// three passes: the bf16 probes on a CPU without bf16 instructions (an AVX2-only EPYC: 2.7
// GFLOP/s in bf16, 95 in fp32; 8 s a pass of the bf16 model), where seven passes made a
// calibration take a minute a thread count and the rate, 35x slower than fp32's, needs no
// finer measure to say that bf16 does not pay there.
// The bf16 model is the first shape at one sequence a batch where a pass of that would take
// over a second at the full batch: there (no bf16 instructions) the full batch's four passes
// took half a calibration's time, and a product's rate in a scalar fallback does not depend
// on its rows. Elsewhere it is the first model itself, as before.
ProbeTimings time_probes(const std::vector<ProbeShape>& shapes) {
  constexpr int kRounds = 7, kSlowRounds = 3;
  constexpr double kSlowPassSeconds = 1.0;
  std::vector<std::unique_ptr<Probe>> probes;
  for (const auto& shape : shapes) probes.push_back(std::make_unique<Probe>(shape));
  ProbeShape one_sequence = shapes.front();
  one_sequence.batch = 1;
  auto small_bf16 = std::make_unique<Probe>(one_sequence);
  const double small_pass = best_seconds(1, [&] { small_bf16->pass(DType::BFloat16); });
  if (small_pass * static_cast<double>(shapes.front().batch) <= kSlowPassSeconds) small_bf16.reset();
  Probe& bf16_model = small_bf16 ? *small_bf16 : *probes.front();
  AttentionProbe fp32(DType::Float32), bf16(DType::BFloat16);
  std::vector<std::function<void()>> passes;
  for (auto& probe : probes) passes.emplace_back([&probe] { probe->pass(); });
  passes.emplace_back([&] { fp32.pass(); });
  passes.emplace_back([&] { bf16.pass(); });
  passes.emplace_back([&] { bf16_model.pass(DType::BFloat16); });
  std::vector<int> rounds;
  for (auto& pass : passes) rounds.push_back(best_seconds(1, pass) > kSlowPassSeconds ? kSlowRounds : kRounds);
  std::vector<std::vector<double>> times(passes.size());
  for (int round = 0; round < kRounds; ++round)
    for (size_t i = 0; i < passes.size(); ++i)
      if (round < rounds[i]) times[i].push_back(best_seconds(1, passes[i]));
  const auto median = [&](size_t i) {
    auto& t = times[i];
    const auto middle = t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2);
    std::nth_element(t.begin(), middle, t.end());
    return *middle;
  };
  const auto timing = [&](const Probe& p, DType compute, double seconds) {
    const TokenCost cost = token_cost(p.model, p.shape.seq, compute);
    const double n = static_cast<double>(p.shape.batch * p.shape.seq);
    return ProbeTiming{seconds, n * cost.matmul_flops, n * cost.attention_flops, n * cost.elementwise_bytes};
  };
  ProbeTimings out;
  for (size_t i = 0; i < probes.size(); ++i) out.models.push_back(timing(*probes[i], DType::Float32, median(i)));
  out.attention_fp32 = fp32.flops / median(probes.size());
  out.attention_bf16 = bf16.flops / median(probes.size() + 1);
  out.bf16_model = timing(bf16_model, DType::BFloat16, median(probes.size() + 2));
  return out;
}

// Threads that run `body` beside a measurement, as the other ranks of a machine would,
// until this is destroyed (also when the measurement throws). `body` returns once the
// flag it is given is set.
class Companions {
 public:
  Companions(int n, const std::function<void(const std::atomic<bool>& done)>& body) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, body] { body(done_); });
  }
  ~Companions() {
    done_ = true;
    for (auto& t : threads_) t.join();
  }
  Companions(const Companions&) = delete;
  Companions& operator=(const Companions&) = delete;

 private:
  std::atomic<bool> done_{false};
  std::vector<std::thread> threads_;
};

// The calibration's probe models (dim, layers, vocabulary, sequence, batch): one of the
// bundled tiny LLaMA's, one dominated by its logits, one by its matmuls.
const std::vector<ProbeShape> kProbeShapes = {{256, 2, 4096, 256, 4}, {128, 2, 16384, 256, 4}, {512, 2, 1024, 128, 8}};

struct FittedRates {
  double matmul = 0, elementwise = 0, attention_fp32 = 0, attention_bf16 = 0;
  double bf16_matmul = 0;  // the bf16 model's products, FLOP/s
};

// The matmul rate R and elementwise rate W that best explain the probes' times less
// their attention's at the rate measured for it, t - A / Ra = F / R + B / W (least
// squares on relative errors), from shapes that weigh the two
// differently: one of the bundled tiny LLaMA's, one dominated by its logits, one by its
// matmuls.
// `companions` threads run the same probes meanwhile (the other ranks of a machine whose
// cores each hold a one-thread rank): what one rank reaches while every core works,
// sharing caches and memory bandwidth (measured: 13% slower than beside idle cores).
FittedRates fit_rates(int companions) {
  const std::vector<ProbeShape>& shapes = kProbeShapes;
  ProbeTimings timings;
  {
    const Companions others(companions, [&](const std::atomic<bool>& done) {
      std::vector<std::unique_ptr<Probe>> probes;
      for (const auto& shape : shapes) probes.push_back(std::make_unique<Probe>(shape));
      while (!done)
        for (auto& probe : probes) probe->pass();
    });
    timings = time_probes(shapes);
  }
  double aa = 0, ab = 0, bb = 0, at = 0, bt = 0;
  FittedRates fitted;
  fitted.attention_fp32 = timings.attention_fp32;
  fitted.attention_bf16 = timings.attention_bf16;
  for (const ProbeTiming& t : timings.models) {
    // Relative residuals: each probe's row divided by its time.
    // At least a fifth of a probe's time is its matmuls' and elementwise work's, whatever
    // a wandering machine made of the attention probe.
    const double seconds = std::max(0.2 * t.seconds, t.seconds - t.attention_flops / fitted.attention_fp32);
    const double a = t.matmul_flops / seconds, b = t.elementwise_bytes / seconds;
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
  fitted.matmul = x > 0 ? 1.0 / x : 1e15;
  fitted.elementwise = y > 0 ? 1.0 / y : 1e15;
  // bf16's products, from the bf16 model's time less its attention's and its elementwise
  // work's at the rates above. Not the fp32 rate scaled by the GEMM peaks' ratio: that
  // scales with them whatever of the elementwise work the fp32 fit took into its matmul
  // rate, which on a busy machine (where the fit can find no elementwise term) made bf16
  // steps twice as fast as they ran.
  const ProbeTiming& b = timings.bf16_model;
  const double not_matmul = b.attention_flops / fitted.attention_bf16 + b.elementwise_bytes / fitted.elementwise;
  fitted.bf16_matmul = b.matmul_flops / std::max(0.2 * b.seconds, b.seconds - not_matmul);
  return fitted;
}
// How much faster a one-thread rank computes while the machine's other ranks wait (a
// pipeline stage during another's fill, drain or slack) than while they compute too: they
// share caches, memory bandwidth and, on a loaded machine, what cores the load leaves.
// The first probe model's pass, timed with `companions` threads computing beside it and
// with them paused, alternately, seven of each; the ratio of the medians (at least 1).
double idle_peer_speedup(int companions) {
  if (companions <= 0) return 1.0;
  const ProbeShape& shape = kProbeShapes.front();
  std::atomic<bool> working{true};
  std::atomic<int> paused{0};
  std::vector<double> busy, alone;
  {
    const Companions others(companions, [&](const std::atomic<bool>& done) {
      Probe probe(shape);
      while (!done) {
        if (working) {
          probe.pass();
          continue;
        }
        ++paused;
        while (!working && !done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        --paused;
      }
    });
    Probe probe(shape);
    probe.pass();  // warm-up
    for (int round = 0; round < 7; ++round) {
      working = true;
      busy.push_back(best_seconds(1, [&] { probe.pass(); }));
      working = false;
      while (paused < companions) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      alone.push_back(best_seconds(1, [&] { probe.pass(); }));
    }
  }
  std::nth_element(busy.begin(), busy.begin() + 3, busy.end());
  std::nth_element(alone.begin(), alone.begin() + 3, alone.end());
  return std::max(1.0, busy[3] / alone[3]);
}

// Two ranks of one machine (threads here, each with its own process group: Gloo over
// loopback), each alternating a slice of compute with an all-reduce, as a tensor-parallel
// block does. A collective costs what that loop takes beyond the same loop without it:
// the transfer, the wake-up of a rank whose core was busy, and the wait for the slower
// rank. Back-to-back all-reduces on idle ranks see only the first, and training's tp2
// all-reduces cost three to four times what such a probe predicted. The latency and
// bandwidth of t = latency + bytes / bandwidth (a two-rank ring moves each byte once)
// are fitted to three sizes, each the median of five interleaved rounds.
std::pair<double, double> probe_collectives(int port) {
  const std::vector<int64_t> sizes = {0, int64_t{16} * 1024, int64_t{512} * 1024, int64_t{2} * 1024 * 1024};
  constexpr int kCollectives = 12, kRounds = 5;
  std::vector<std::vector<double>> loop_seconds(sizes.size());
  std::exception_ptr failed;
  const int threads_before = at::get_num_threads();
  at::set_num_threads(1);  // one thread per rank, as two ranks on this machine train
  auto rank = [&](int r) {
    try {
      LaunchEnv env;
      env.rank = env.local_rank = r;
      env.world = env.local_world = 2;
      env.master_port = port;
      env.launcher = "tide plan --calibrate";
      auto dist = init_distributed(env, ParallelConfig{}, std::chrono::seconds(60));
      // A slice of about 5 ms on one core of this class (0.5 GFLOP), of the order of the
      // work between a small model's tensor-parallel collectives: how long a rank waits
      // for its slower peer grows with the work in between.
      const auto x = torch::randn({256, 1024}), w = torch::randn({1024, 1024});
      std::vector<torch::Tensor> buffers;
      for (const int64_t n : sizes) buffers.push_back(torch::ones({std::max<int64_t>(n, 1)}));
      for (size_t i = 1; i < sizes.size(); ++i) dist->world->all_reduce_sum(buffers[i], "calibration warm-up");
      for (int round = 0; round < kRounds; ++round)
        for (size_t i = 0; i < sizes.size(); ++i) {
          dist->world->barrier("calibration");
          const double s = best_seconds(1, [&] {
            for (int c = 0; c < kCollectives; ++c) {
              auto y = torch::mm(x, w);
              if (sizes[i] > 0) dist->world->all_reduce_sum(buffers[i], "calibration");
            }
          });
          if (r == 0) loop_seconds[i].push_back(s);
        }
    } catch (...) {
      failed = std::current_exception();
    }
  };
  std::thread peer(rank, 1);
  rank(0);
  peer.join();
  at::set_num_threads(threads_before);
  if (failed) std::rethrow_exception(failed);
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  // Least squares of cost = latency + bytes * (1 / bandwidth) over the three sizes.
  const double none = median(loop_seconds[0]);
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  const double k = static_cast<double>(sizes.size() - 1);
  for (size_t i = 1; i < sizes.size(); ++i) {
    const double bytes = 4.0 * static_cast<double>(sizes[i]);
    const double cost = std::max(0.0, median(loop_seconds[i]) - none) / kCollectives;
    sx += bytes;
    sy += cost;
    sxx += bytes * bytes;
    sxy += bytes * cost;
  }
  double inverse_bandwidth = (k * sxy - sx * sy) / (k * sxx - sx * sx);
  double latency = (sy - inverse_bandwidth * sx) / k;
  if (!(inverse_bandwidth > 0)) inverse_bandwidth = sy / sx;  // noise hid the slope: all of it bandwidth
  if (!(latency > 0)) latency = 0;
  return {1.0 / inverse_bandwidth, latency};
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
  // One-thread ranks are probed beside a busy twin on every other core; a rank of
  // several threads is probed alone (two callers would share one intra-op pool).
  const int companions = threads == 1 ? local_cores() - 1 : 0;
  const FittedRates fitted = fit_rates(companions);
  // Ranks of several threads are probed alone: how much their neighbours' rest would speed
  // them up is not measured (1).
  d.idle_peer_speedup = idle_peer_speedup(companions);
  const double matmul_rate = fitted.matmul, elementwise_rate = fitted.elementwise;
  d.attention_fp32_flops = fitted.attention_fp32;
  d.attention_bf16_flops = fitted.attention_bf16;
  // The peak is the GEMM probe's, unless the model's own products ran faster (the machine
  // was busier during the GEMM probe).
  d.fp32_flops = std::max(d.fp32_flops, matmul_rate);
  d.matmul_efficiency = matmul_rate / d.fp32_flops;
  // bf16 products: 4x fp32's on a core with AVX512-BF16 (measured on an AMD EPYC of this
  // project's machines), a scalar fallback on one without. The model's reach their own
  // share of that peak, measured like fp32's.
  d.bf16_flops = std::max(measure_matmul_peak("cpu", DType::BFloat16), fitted.bf16_matmul);
  d.bf16_matmul_efficiency = fitted.bf16_matmul / d.bf16_flops;
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
