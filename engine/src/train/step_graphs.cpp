#include "step_graphs.h"

#include <exception>
#include <utility>

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "cuda_kernels_config.h"
#ifdef TIDE_CUDA_KERNELS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace tide {
namespace {
// Steps run as called before a capture: cuBLAS, cuDNN and the autograd engine set up
// their workspaces and threads for the graphs' stream then, which they cannot do while
// it is captured.
constexpr int64_t kWarmupSteps = 3;
// Settings that keep changing would spend the run capturing: after this many captures
// the graphs are switched off.
constexpr int kMaxCaptures = 8;
}  // namespace

std::optional<std::string> why_steps_run_uncaptured(const RunConfig& cfg, const StepCaptureFacts& facts) {
  if (cfg.device != "cuda") return fmt::format("device = {}, not cuda", cfg.device);
  if (!cfg.cuda_graphs) return std::string("cuda_graphs = false");
  if (!facts.cuda_build) return std::string("this LibTorch has no CUDA graphs");
  if (facts.distributed) return std::string("the run has ranks, whose collectives are not captured");
  if (cfg.parallel.offload_optimizer)
    return std::string("parallel.offload_optimizer = true: the update runs on the host");
  if (!facts.optimizer_on_device) return std::string("the optimizer reads its gate on the host");
  if (cfg.model.dropout > 0)
    return fmt::format("model.dropout = {}: dropout's random masks are not captured", cfg.model.dropout);
  if (cfg.model.lora_rank > 0 && cfg.model.lora_dropout > 0)
    return fmt::format("model.lora_dropout = {}: dropout's random masks are not captured", cfg.model.lora_dropout);
  if (cfg.model.moe_experts > 0)
    return fmt::format("model.moe_experts = {}: dropless routing sizes each expert's batch on the host",
                       cfg.model.moe_experts);
  if (facts.anomaly_policy) return std::string("the recipe's on_anomaly policy judges each step before its update");
  if (facts.loss_tap) return std::string("a loss tap reads each micro-batch's loss on the host");
  return std::nullopt;
}

#ifdef TIDE_CUDA_KERNELS
bool step_graphs_built() { return true; }
#else
bool step_graphs_built() { return false; }
#endif

struct StepGraphs::Impl {
  // warming: steps run as called; capture: the next forward_backward is captured;
  // capture_update: the forward and backward were, the update is next; replay: both
  // graphs exist.
  enum class Phase { off, warming, capture, capture_update, replay };

  Impl(c10::Device d, spdlog::logger& l) : device(d), log(l) {}

  c10::Device device;
  spdlog::logger& log;
  Phase phase = Phase::off;
  int64_t warm_left = kWarmupSteps;
  int captures = 0;
  int64_t replayed = 0;
  std::vector<Batch> inputs;  // the batches the captured forward and backward read
  StepValues fb_out;          // what its replays write
  at::Tensor update_out;

#ifdef TIDE_CUDA_KERNELS
  std::optional<c10::cuda::CUDAStream> stream;
  std::unique_ptr<at::cuda::CUDAGraph> fb_graph, update_graph;
  cudaEvent_t before = nullptr, after = nullptr;

  ~Impl() {
    try {
      drop();
    } catch (const std::exception&) {  // a CUDA error that ended the run: nothing is left to wait for
    }
    if (before) (void)cudaEventDestroy(before);
    if (after) (void)cudaEventDestroy(after);
  }

  // The graphs' stream for a region: its work follows what the ambient stream was given
  // before the region, and what the ambient stream is given after follows it. So the
  // loop's other work (the batches' copies, evaluation, checkpoints, the readout) stays
  // on the ambient stream in step order.
  class OnStream {
   public:
    explicit OnStream(Impl& m) : m_(m), ambient_(c10::cuda::getCurrentCUDAStream(m.device.index())), guard_(*m.stream) {
      C10_CUDA_CHECK(cudaEventRecord(m_.before, ambient_.stream()));
      C10_CUDA_CHECK(cudaStreamWaitEvent(m_.stream->stream(), m_.before, 0));
    }
    ~OnStream() {
      // No throw from a destructor: a failure here shows at the next CUDA call.
      if (cudaEventRecord(m_.after, m_.stream->stream()) == cudaSuccess)
        (void)cudaStreamWaitEvent(ambient_.stream(), m_.after, 0);
    }
    OnStream(const OnStream&) = delete;
    OnStream& operator=(const OnStream&) = delete;

   private:
    Impl& m_;
    c10::cuda::CUDAStream ambient_;
    c10::cuda::CUDAStreamGuard guard_;
  };

  void start() {
    stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, device.index());
    const c10::cuda::CUDAGuard on_device(device.index());
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&before, cudaEventDisableTiming));
    C10_CUDA_CHECK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
    phase = Phase::warming;
  }

  // Graphs in flight finish before their memory pools go back to the allocator, which
  // would hand that memory out at once.
  void drop() {
    if (stream && (fb_graph || update_graph)) stream->synchronize();
    fb_out = {};
    update_out.reset();
    inputs.clear();
    update_graph.reset();
    fb_graph.reset();
  }

  // Captures fn's work on the graphs' stream into `graph`; on failure ends the capture,
  // clears CUDA's error and rethrows.
  template <typename Fn>
  auto capture(std::unique_ptr<at::cuda::CUDAGraph>& graph, const Fn& fn) {
    auto g = std::make_unique<at::cuda::CUDAGraph>();
    // Thread-local: an embedding process may run other CUDA work on its own threads.
    g->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
    try {
      auto out = fn();
      g->capture_end();
      graph = std::move(g);
      return out;
    } catch (...) {
      try {
        g->capture_end();
      } catch (...) {  // the capture was already invalid: that is the error rethrown below
      }
      (void)cudaGetLastError();
      throw;
    }
  }

  bool same_shapes(const std::vector<Batch>& batches) const {
    if (batches.size() != inputs.size()) return false;
    for (size_t i = 0; i < batches.size(); ++i)
      if (!batches[i].tokens.sizes().equals(inputs[i].tokens.sizes()) ||
          !batches[i].targets.sizes().equals(inputs[i].targets.sizes()) ||
          batches[i].documents.defined() != inputs[i].documents.defined())
        return false;
    return true;
  }
#else
  void drop() {}
#endif

  void give_up(const std::string& why) {
    log.warn("CUDA graphs: off for the rest of the run: {}; steps run as called", why);
    drop();
    phase = Phase::off;
  }
};

StepGraphs::StepGraphs(c10::Device device, std::optional<std::string> blocker, spdlog::logger& log)
    : impl_(std::make_unique<Impl>(device, log)) {
  if (!device.is_cuda()) return;
  if (blocker) {
    log.info("CUDA graphs: steps run as called: {}", *blocker);
    return;
  }
#ifdef TIDE_CUDA_KERNELS
  impl_->start();
  log.info("CUDA graphs: each step is captured after {} steps run as called, then replayed", kWarmupSteps);
#endif
}

StepGraphs::~StepGraphs() = default;

int64_t StepGraphs::replayed_steps() const { return impl_->replayed; }

void StepGraphs::reset(const std::string& why) {
  Impl& m = *impl_;
  if (m.phase == Impl::Phase::off) return;
  if (m.captures >= kMaxCaptures) {
    m.give_up(fmt::format("captured {} times, and {}", m.captures, why));
    return;
  }
  m.drop();
  if (m.phase == Impl::Phase::replay || m.phase == Impl::Phase::capture_update)
    m.log.info("CUDA graphs: {}: captured again after {} steps run as called", why, kWarmupSteps);
  m.phase = Impl::Phase::warming;
  m.warm_left = kWarmupSteps;
}

StepValues StepGraphs::forward_backward(const std::vector<Batch>& batches, const ForwardBackward& fn) {
  Impl& m = *impl_;
  if (m.phase == Impl::Phase::off) return fn(batches);
#ifdef TIDE_CUDA_KERNELS
  if (m.phase == Impl::Phase::replay && !m.same_shapes(batches)) reset("the batch shape changed");
  const Impl::OnStream on(m);
  switch (m.phase) {
    case Impl::Phase::off:
    case Impl::Phase::warming: return fn(batches);
    case Impl::Phase::replay:
      for (size_t i = 0; i < batches.size(); ++i) {
        m.inputs[i].tokens.copy_(batches[i].tokens, /*non_blocking=*/true);
        m.inputs[i].targets.copy_(batches[i].targets, /*non_blocking=*/true);
        if (batches[i].documents.defined()) m.inputs[i].documents.copy_(batches[i].documents, /*non_blocking=*/true);
      }
      m.fb_graph->replay();
      return m.fb_out;
    case Impl::Phase::capture:
    case Impl::Phase::capture_update: break;
  }
  m.drop();
  for (const Batch& b : batches)
    m.inputs.push_back(
        {b.tokens.clone(), b.targets.clone(), b.documents.defined() ? b.documents.clone() : at::Tensor()});
  try {
    m.fb_out = m.capture(m.fb_graph, [&] { return fn(m.inputs); });
  } catch (const std::exception& e) {
    m.give_up(fmt::format("capturing the forward and backward failed: {}", e.what()));
    return fn(batches);
  }
  m.fb_graph->replay();
  m.phase = Impl::Phase::capture_update;
  return m.fb_out;
#else
  return fn(batches);
#endif
}

at::Tensor StepGraphs::update(const std::function<at::Tensor()>& fn) {
  Impl& m = *impl_;
  if (m.phase == Impl::Phase::off) return fn();
#ifdef TIDE_CUDA_KERNELS
  const Impl::OnStream on(m);
  switch (m.phase) {
    case Impl::Phase::off:
    case Impl::Phase::capture: return fn();
    case Impl::Phase::warming: {
      at::Tensor out = fn();
      if (--m.warm_left == 0) m.phase = Impl::Phase::capture;
      return out;
    }
    case Impl::Phase::replay:
      m.update_graph->replay();
      ++m.replayed;
      return m.update_out;
    case Impl::Phase::capture_update: break;
  }
  try {
    m.update_out = m.capture(m.update_graph, fn);
  } catch (const std::exception& e) {
    // This step's forward and backward ran from their graph; its update runs as called.
    m.give_up(fmt::format("capturing the update failed: {}", e.what()));
    return fn();
  }
  m.update_graph->replay();
  ++m.replayed;
  ++m.captures;
  m.phase = Impl::Phase::replay;
  // The steps run as called left their memory cached for this stream; the graphs hold
  // their own from now on.
  c10::cuda::CUDACachingAllocator::emptyCache();
  if (m.captures == 1) m.log.info("CUDA graphs: the step is captured; later steps replay it");
  return m.update_out;
#else
  return fn();
#endif
}

}  // namespace tide
