// The planner: for a recipe on a cluster, every layout tide can run (dp x tp x pp, cp, ep, ZeRO
// stage, optimizer offload, activation checkpointing, sequence parallelism, pipeline
// schedule and micro-batch), the memory each rank needs and the time a step takes, both
// itemised and both derived from tide's own code paths (what its flat buffers, ZeRO
// units, autograd nodes, loss and pipeline keep alive; which collectives it runs and
// which of them overlap). `tide plan` prints the ranking; `parallel.auto` trains with
// the first. No LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tide/engine/config.h"
#include "tide/engine/plan/cluster.h"

namespace tide {

struct PlanLayout {
  int dp = 1, tp = 1, pp = 1;
  int cp = 1;  // context parallelism: each sequence over cp ranks
  std::string cp_comm = "all_gather";  // its attention's collective (parallel.cp_comm)
  int ep = 1;  // expert parallelism: a mixture of experts' experts spread over ep of the dp ranks
  int zero = 0;
  bool offload = false;
  bool activation_checkpointing = false;
  int64_t recompute_blocks = 0;  // with checkpointing: the first N blocks of each chunk; 0: all
  bool sequence_parallel = false;
  std::string schedule = "1f1b";  // pipeline schedule (pp > 1)
  int64_t virtual_stages = 1;     // chunks per pipeline rank (interleaved 1F1B above 1)
  int64_t micro_batch = 1;        // sequences per forward/backward on one rank
  int64_t micro_batches = 1;      // per rank and optimizer step (accumulation, or the pipeline's)

  // "dp8 tp1 pp1 zero1 mb2x4 ckpt" ("ckpt3": 3 blocks of each chunk; " cp2" where set,
  // " cp2 a2a" in the all-to-all form, " ep2" where set)
  std::string describe() const;
  int replicas() const { return dp * cp; }  // the ranks that average gradients and shard ZeRO's state
  // Written into a run configuration: parallel.*, batch.micro_batch and the model's
  // activation checkpointing (the global batch stays the recipe's).
  void apply_to(RunConfig& cfg) const;
};

// Bytes one rank holds at its peak, by what holds them. `device` is the device's total
// (for the CPU: the host's); `host` what optimizer offload keeps in host memory.
struct MemoryEstimate {
  double parameters = 0;                     // fp32 flat parameters (ZeRO-3: this rank's pieces)
  double gradients = 0;                      // fp32 flat gradients (ZeRO-2/3: this rank's pieces)
  double optimizer = 0;                      // AdamW moments on the device
  double working_copy = 0;                   // bf16 copies of the weights cast once per step
  double gathered = 0;                       // ZeRO-3 units gathered whole, ZeRO-2/3 unit gradients in flight
  double activations = 0;                    // what autograd saves for backward, all micro-batches in flight
  double loss = 0;                           // the gradients the loss makes in its forward
  double backward_transient = 0;             // the largest set of temporaries backward makes at once
  double communication = 0;                  // pipeline receive buffers, collective staging
  double runtime = 0;                        // CUDA context, workspaces, allocator fragmentation
  double device = 0;                         // the peak: the sum of the above
  double host = 0;                           // offloaded optimizer state (host memory)
  double checkpoint = 0;                     // an asynchronous checkpoint's snapshot (host memory)
  std::vector<double> activations_by_block;  // one micro-batch, per block of the largest stage
  int peak_stage = 0;                        // the pipeline stage whose ranks need the most
  std::vector<double> by_stage;              // `device` of each pipeline stage's ranks
};

// Seconds of one optimizer step, by where they go. `step` is what a rank waits in all:
// overlapped communication counts only for the part compute cannot hide.
struct TimeEstimate {
  double compute = 0;      // matmuls and attention, forward and backward
  double recompute = 0;    // activation checkpointing's second forward
  double elementwise = 0;  // norms, activations, softmax, residuals: memory bound
  double tp_comm = 0;      // tensor-parallel all-reduces / sequence gathers (not hidden)
  double cp_comm = 0;      // context parallelism's key/value gathers and their gradients' reduce-scatters
  double ep_comm = 0;      // expert parallelism's exchanges of routed tokens and their gradients
  double dp_comm = 0;      // gradient reduction, ZeRO gathers: what compute does not hide
  double pp_comm = 0;      // pipeline sends and receives
  double bubble = 0;       // the pipeline's idle fill and drain
  double optimizer = 0;    // AdamW over the rank's elements, offload transfers
  double step = 0;
  double tokens_per_second = 0;  // the whole cluster
  double mfu = 0;                // model FLOPs / (step x devices x peak)
  double dp_comm_total = 0;      // gradient traffic before overlap (for the advice)
};

struct LayoutPlan {
  PlanLayout layout;
  MemoryEstimate memory;
  TimeEstimate time;
  bool fits = false;
  int64_t largest_micro_batch = 0;  // the largest micro-batch of this layout that fits (0: none)
  std::string reason;               // why it is refused or ranked low
};

struct PlanOptions {
  int64_t max_micro_batch = 64;  // largest micro-batch tried
  bool allow_offload = true;
  // Only layouts with these factors when set (tide plan --tp 8, parallel.auto with a fixed tp).
  std::optional<int> tp, pp, zero, ep;
  // Only layouts with this context-parallel size; unset: none (cp = 1) unless no layout
  // without it fits, then the smallest cp with which one does.
  std::optional<int> cp;
  double memory_headroom = 0.0;  // fraction of device memory kept free (0: use it all)
};

struct Plan {
  std::string recipe;
  Cluster cluster;
  int64_t parameters = 0;
  int64_t active_parameters = 0;  // those a token is multiplied by (a mixture of experts: its top k)
  double flops_per_token = 0;
  DType compute = DType::Float32;           // the compute dtype the plan assumed
  std::vector<LayoutPlan> ranked;           // feasible, fastest first (ties: less memory)
  std::vector<LayoutPlan> rejected;         // the best of each refused (dp, tp, pp, zero) family, with reasons
  std::optional<LayoutPlan> recipe_layout;  // the recipe's own layout, evaluated
};

// Memory and time of one layout of `cfg` on `cluster` (the layout must be valid).
LayoutPlan evaluate_layout(const RunConfig& cfg, const Cluster& cluster, const PlanLayout& layout);
// Every valid layout for cfg's model and global batch on the cluster, ranked.
Plan plan_layouts(const RunConfig& cfg, const Cluster& cluster, const PlanOptions& options = {});

// The recipe's own layout (parallel.*, batch.micro_batch, activation checkpointing) on
// `world` ranks, in planner terms. Throws ConfigError where the recipe's layout is invalid.
PlanLayout layout_of(const RunConfig& cfg, int world);

// parallel.auto: the fastest layout that fits, the runner-up, a sentence saying why,
// and the `--set` overrides that give a run that layout (parallel.auto off). Throws
// ConfigError("parallel.auto", ...) with the shortfall when nothing fits.
struct LayoutChoice {
  LayoutPlan chosen;
  std::optional<LayoutPlan> runner_up;
  std::string explanation;
  std::vector<std::string> overrides;
};
LayoutChoice choose_layout(const RunConfig& cfg, const Cluster& cluster, const PlanOptions& options = {});

// What the time model charges per token of one process running the whole model (one
// stage, no tensor parallelism): the weights' matmul FLOPs, attention's (causal at half
// its counted FLOPs), forward and backward, and bytes of elementwise memory traffic. The
// calibration runs such a model, takes out attention's time at the rate it measured, and
// attributes to elementwise work what the matmuls do not explain.
struct TokenCost {
  double matmul_flops = 0, attention_flops = 0, elementwise_bytes = 0;
};
TokenCost token_cost(const ModelConfig& m, int64_t seq_len, DType compute);

// The plan as `tide plan --json` prints it (docs/plan.schema.json): the best `top` ranked
// layouts, and how many fit in all (`layouts_that_fit`).
nlohmann::json to_json(const Plan& plan, size_t top = SIZE_MAX);
nlohmann::json to_json(const LayoutPlan& plan);
// The ranking as text: a table of the best `top` layouts, the first one itemised, and
// the reasons the others were refused.
std::string format_plan(const Plan& plan, int top = 10);

}  // namespace tide
