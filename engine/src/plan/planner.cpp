#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "estimates.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/model/pipeline_stage.h"
#include "tide/engine/parallel/grid.h"
#include "tide/engine/plan/plan.h"
#include "tide/engine/run_layout.h"
#include "tide/engine/train/flops.h"

namespace tide {

std::string PlanLayout::describe() const {
  std::string s = fmt::format("dp{} tp{} pp{} zero{} mb{}x{}", dp, tp, pp, zero, micro_batch, micro_batches);
  if (cp > 1) s += fmt::format(" cp{}{}", cp, cp_comm == "all_to_all" ? " a2a" : "");
  if (ep > 1) s += fmt::format(" ep{}", ep);
  if (pp > 1) s += " " + schedule;
  if (virtual_stages > 1) s += fmt::format(" v{}", virtual_stages);
  if (sequence_parallel) s += " sp";
  if (activation_checkpointing) s += recompute_blocks > 0 ? fmt::format(" ckpt{}", recompute_blocks) : " ckpt";
  if (offload) s += " offload";
  return s;
}

void PlanLayout::apply_to(RunConfig& cfg) const {
  cfg.parallel.dp = dp;
  cfg.parallel.tp = tp;
  cfg.parallel.pp = pp;
  cfg.parallel.cp = cp;
  cfg.parallel.cp_comm = cp_comm;
  cfg.parallel.ep = ep;
  cfg.parallel.zero = zero;
  cfg.parallel.offload_optimizer = offload;
  cfg.parallel.sequence_parallel = sequence_parallel;
  cfg.parallel.pipeline_schedule = schedule;
  cfg.parallel.virtual_stages = virtual_stages;
  cfg.parallel.micro_batches = 0;
  cfg.batch.micro_batch = micro_batch;
  cfg.model.activation_checkpointing = activation_checkpointing;
  cfg.model.recompute_blocks = activation_checkpointing ? recompute_blocks : 0;
}

namespace {

std::vector<int> divisors(int64_t n) {
  std::vector<int> out;
  for (int64_t d = 1; d <= n; ++d)
    if (n % d == 0) out.push_back(static_cast<int>(d));
  return out;
}

double usable_memory(const DeviceSpec& device, const PlanOptions& options) {
  return device.memory_bytes * (1.0 - options.memory_headroom);
}

// The pipeline schedules worth weighing for pp stages: 1F1B, GPipe and, where the blocks
// allow, interleaved 1F1B over 2 and 4 chunks per stage (Megatron's usual virtual
// pipeline sizes; more chunks shrink the bubble further for more messages).
std::vector<std::pair<std::string, int64_t>> pipeline_schedules(const RunConfig& cfg, int pp) {
  if (pp == 1) return {{"1f1b", 1}};
  std::vector<std::pair<std::string, int64_t>> out = {{"1f1b", 1}, {"gpipe", 1}};
  if (!cfg.parallel.pipeline_stages.empty()) return out;  // given for one chunk per stage
  for (const int64_t chunks : {2, 4})
    if (pp * chunks <= cfg.model.n_layers) out.emplace_back("1f1b", chunks);
  return out;
}

// The largest chunk of blocks any rank runs in `l`.
int64_t largest_chunk(const RunConfig& cfg, const PlanLayout& l) {
  if (l.pp == 1) return cfg.model.n_layers;
  int64_t most = 0;
  for (const auto& stage : partition_stages(cfg.model, l.pp, cfg.data.seq_len, cfg.parallel.pipeline_stages,
                                            l.virtual_stages, cfg.data.document_attention))
    for (const auto& range : stage.chunks) most = std::max(most, range_blocks(range, cfg.model.n_layers));
  return most;
}

enum class Recompute { None, All, Fewest };

// `p` fits with every block recomputed: recompute only the first N of each chunk, the
// fewest that fit (Megatron-Core's recompute_num_layers), where recomputing none does
// not fit. Memory falls as N grows, so the least N is found by bisection. False, and `p`
// unchanged, where no N short of every block does.
bool recompute_fewer_blocks(const RunConfig& cfg, const Cluster& cluster, double usable, LayoutPlan& p) {
  const auto recomputing = [&](PlanLayout l, int64_t n) {
    l.activation_checkpointing = n > 0;
    l.recompute_blocks = n;
    LayoutPlan q = evaluate_layout(cfg, cluster, l);
    q.fits = q.memory.device <= usable;
    return q;
  };
  if (recomputing(p.layout, 0).fits) return false;  // the same layout without recomputation is faster
  const int64_t all = largest_chunk(cfg, p.layout);
  int64_t lo = 0, hi = all;  // lo does not fit, hi does
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (recomputing(p.layout, mid).fits ? hi : lo) = mid;
  }
  if (hi == all) return false;
  p = recomputing(p.layout, hi);
  return true;
}

// The expert-parallel sizes to weigh over dp ranks: 1 (every rank holds every expert),
// and for a mixture of experts each divisor of dp that divides its experts.
std::vector<int> expert_parallel_sizes(const ModelConfig& m, int dp) {
  std::vector<int> out{1};
  if (m.moe_experts == 0) return out;
  for (const int ep : divisors(dp))
    if (ep > 1 && m.moe_experts % ep == 0) out.push_back(ep);
  return out;
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / (1024.0 * 1024.0 * 1024.0)); }

// The largest items of a memory estimate, for a refusal.
std::string largest_items(const MemoryEstimate& m) {
  std::vector<std::pair<double, const char*>> items = {{m.parameters, "parameters"},
                                                       {m.gradients, "gradients"},
                                                       {m.optimizer, "optimizer state"},
                                                       {m.working_copy, "bf16 weights"},
                                                       {m.gathered, "ZeRO buffers"},
                                                       {m.activations, "activations"},
                                                       {m.loss, "logits"},
                                                       {m.backward_transient, "backward temporaries"}};
  std::sort(items.begin(), items.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return fmt::format("{} {}, {} {}, {} {}", items[0].second, gib(items[0].first), items[1].second, gib(items[1].first),
                     items[2].second, gib(items[2].first));
}

// Whether a rank's per_rank sequences go in micro-batches of mb under l's schedule: an
// interleaved schedule takes them in groups of pp.
bool micro_batches_fit_schedule(const PlanLayout& l, int64_t per_rank, int mb) {
  return l.virtual_stages <= 1 || (per_rank / mb) % l.pp == 0;
}

// The largest micro-batch, up to options.max_micro_batch, with which layout l (its other
// fields as they are) fits in `usable` bytes; 0 where none does.
int64_t largest_fitting_micro_batch(const RunConfig& cfg, const Cluster& cluster, PlanLayout l, double usable,
                                    int64_t per_rank, const PlanOptions& options) {
  int64_t largest = 0;
  for (const int mb : divisors(per_rank)) {
    if (mb > options.max_micro_batch) break;
    if (!micro_batches_fit_schedule(l, per_rank, mb)) continue;
    l.micro_batch = mb;
    l.micro_batches = per_rank / mb;
    if (evaluate_layout(cfg, cluster, l).memory.device > usable) break;  // larger ones need more
    largest = mb;
  }
  return largest;
}

}  // namespace

LayoutPlan evaluate_layout(const RunConfig& cfg, const Cluster& cluster, const PlanLayout& layout) {
  LayoutPlan p;
  p.layout = layout;
  const DType compute = plan::planned_compute_dtype(cfg, cluster.device);
  p.memory = plan::estimate_memory(cfg, cluster.device, layout, compute);
  p.time = plan::estimate_time(cfg, cluster, layout, compute);
  // fp16's tensor-core rate is bf16's on every device the catalog describes.
  const double peak = compute == DType::Float32 ? cluster.device.fp32_flops : cluster.device.bf16_flops;
  p.time.mfu = train_flops_per_token(cfg.model, cfg.data.seq_len) * p.time.tokens_per_second /
               (static_cast<double>(cluster.world()) * peak);
  p.fits = p.memory.device <= cluster.device.memory_bytes;
  if (!p.fits)
    p.reason = fmt::format("does not fit: needs {} of {} ({})", gib(p.memory.device), gib(cluster.device.memory_bytes),
                           largest_items(p.memory));
  return p;
}

PlanLayout layout_of(const RunConfig& cfg, int world) {
  check_supported_layout(cfg, world);
  const BatchLayout batch = batch_layout(cfg, world);
  PlanLayout l;
  l.dp = static_cast<int>(batch.dp);
  l.tp = static_cast<int>(cfg.parallel.tp);
  l.pp = static_cast<int>(cfg.parallel.pp);
  l.cp = static_cast<int>(batch.cp);
  l.cp_comm = cfg.parallel.cp_comm;
  l.ep = static_cast<int>(cfg.parallel.ep);
  l.zero = static_cast<int>(cfg.parallel.zero);
  l.offload = cfg.parallel.offload_optimizer;
  l.activation_checkpointing = cfg.model.activation_checkpointing;
  l.recompute_blocks = cfg.model.recompute_blocks;
  l.sequence_parallel = cfg.parallel.sequence_parallel && l.tp > 1;
  l.schedule = cfg.parallel.pipeline_schedule;
  l.virtual_stages = cfg.parallel.virtual_stages;
  l.micro_batch = batch.micro_batch;
  l.micro_batches = accumulation_steps(cfg.batch.global_batch, batch);
  return l;
}

Plan plan_layouts(const RunConfig& cfg, const Cluster& cluster, const PlanOptions& options) {
  Plan plan;
  plan.recipe = cfg.name;
  plan.cluster = cluster;
  plan.parameters = parameter_count(cfg.model);
  plan.active_parameters = plan.parameters - inactive_expert_parameter_count(cfg.model);
  plan.flops_per_token = train_flops_per_token(cfg.model, cfg.data.seq_len);
  plan.compute = plan::planned_compute_dtype(cfg, cluster.device);
  const int world = cluster.world();
  const int64_t global_batch = cfg.batch.global_batch;
  const double usable = usable_memory(cluster.device, options);
  const ModelConfig& m = cfg.model;

  auto refuse = [&](PlanLayout l, std::string reason) {
    LayoutPlan p;
    p.layout = std::move(l);
    p.reason = std::move(reason);
    plan.rejected.push_back(std::move(p));
  };

  // Context parallelism (each sequence over cp ranks) costs collectives in every block
  // and saves activation memory alone: it is weighed only where no layout with a smaller
  // cp fits (the smallest cp that makes one fit), or where asked for; in both its forms,
  // all-gather and all-to-all (where the heads split over cp).
  std::vector<std::pair<int, std::string>> contexts;
  for (const int cp : divisors(world)) {
    contexts.emplace_back(cp, "all_gather");
    if (cp > 1) contexts.emplace_back(cp, "all_to_all");
  }
  for (const auto& [cp, cp_comm] : contexts) {
    const bool smaller_cp_fits = std::any_of(plan.ranked.begin(), plan.ranked.end(),
                                             [cp = cp](const LayoutPlan& p) { return p.layout.cp < cp; });
    if (options.cp ? cp != *options.cp : cp > 1 && smaller_cp_fits) continue;
    if (cfg.data.seq_len % (2 * static_cast<int64_t>(cp)) != 0 && cp > 1) continue;
    for (const int tp : divisors(world / cp)) {
      if (options.tp && tp != *options.tp) continue;
      PlanLayout family;
      family.tp = tp;
      family.cp = cp;
      family.cp_comm = cp_comm;
      try {
        check_tensor_parallel(m, tp, false, cfg.data.seq_len);
      } catch (const ConfigError& e) {
        family.dp = 0;
        if (cp == 1) refuse(family, e.what());  // once, not again for each cp
        continue;
      }
      try {
        RunConfig split = cfg;
        split.parallel.sequence_parallel = false;  // weighed below, where it can run
        check_mixture_of_experts(split, cp, tp);
      } catch (const ConfigError& e) {
        family.dp = 0;
        refuse(family, e.what());
        continue;
      }
      if (cp_comm == "all_to_all") {
        RunConfig split = cfg;
        family.apply_to(split);
        try {
          check_context_parallel(split, cp);
        } catch (const ConfigError& e) {
          family.dp = 0;
          refuse(family, e.what());
          continue;
        }
      }
      for (const int pp : divisors(world / (cp * tp))) {
        if (options.pp && pp != *options.pp) continue;
        family.pp = pp;
        family.dp = world / (cp * tp * pp);
        if (pp > m.n_layers) {
          refuse(family, fmt::format("parallel.pp: {} stages for model.n_layers = {} blocks", pp, m.n_layers));
          continue;
        }
        if (global_batch % family.dp != 0) {
          refuse(family,
                 fmt::format("batch.global_batch: {} sequences do not split over dp = {}", global_batch, family.dp));
          continue;
        }
        const int64_t per_rank = global_batch / family.dp;
        if (options.ep) {  // asked for: refused with the engine's reason where it cannot spread the experts
          RunConfig spread = cfg;
          spread.parallel.ep = *options.ep;
          try {
            check_expert_parallel(spread, family.dp);
          } catch (const ConfigError& e) {
            family.ep = *options.ep;
            refuse(family, e.what());
            continue;
          }
        }
        std::vector<std::pair<int, int>> shardings;  // (ep, ZeRO stage)
        for (const int ep : expert_parallel_sizes(m, family.dp))
          for (int zero = 0; zero <= 3; ++zero) shardings.emplace_back(ep, zero);
        for (const auto& [ep, zero] : shardings) {
          if (options.ep && ep != *options.ep) continue;
          if (options.zero && zero != *options.zero) continue;
          if (zero > 0 && family.dp == 1 && !options.zero) continue;  // nothing to shard
          if (pp > 1 && zero == 3) continue;
          family.ep = ep;
          family.zero = zero;
          LayoutPlan best_of_family;  // the fastest that fits, or the smallest that does not
          bool any_fits = false;
          double smallest = -1;
          for (const bool offload : {false, true}) {
            if (offload && !options.allow_offload) continue;
            // Recomputation: none, every block, or the fewest first blocks of each chunk that
            // fit where none does not and every block does.
            for (const Recompute recompute : {Recompute::None, Recompute::All, Recompute::Fewest}) {
              for (const bool sp : {false, true}) {
                if (sp && (tp == 1 || (cfg.data.seq_len / cp) % tp != 0 || m.moe_experts > 0)) continue;
                for (const auto& [schedule, chunks] : pipeline_schedules(cfg, pp)) {
                  PlanLayout l = family;
                  l.offload = offload;
                  l.activation_checkpointing = recompute != Recompute::None;
                  l.sequence_parallel = sp;
                  l.schedule = schedule;
                  l.virtual_stages = chunks;
                  LayoutPlan fastest;
                  int64_t largest = 0;
                  bool fits = false;
                  for (const int mb : divisors(per_rank)) {
                    if (mb > options.max_micro_batch) break;
                    l.micro_batch = mb;
                    l.micro_batches = per_rank / mb;
                    if (!micro_batches_fit_schedule(l, per_rank, mb)) continue;
                    l.recompute_blocks = 0;
                    LayoutPlan p = evaluate_layout(cfg, cluster, l);
                    p.fits = p.memory.device <= usable;
                    if (recompute == Recompute::Fewest && p.fits && !recompute_fewer_blocks(cfg, cluster, usable, p))
                      continue;
                    if (!p.fits) {
                      if (smallest < 0 || p.memory.device < smallest) {
                        smallest = p.memory.device;
                        if (!any_fits) {
                          best_of_family = p;
                          best_of_family.reason =
                              fmt::format("does not fit: needs {} of {} at micro-batch {} ({})", gib(p.memory.device),
                                          gib(usable), mb, largest_items(p.memory));
                        }
                      }
                      break;  // larger micro-batches need more
                    }
                    largest = mb;
                    if (!fits || p.time.step < fastest.time.step) fastest = p;
                    fits = true;
                  }
                  if (!fits) continue;
                  fastest.largest_micro_batch = largest;
                  fastest.reason.clear();
                  any_fits = true;
                  plan.ranked.push_back(std::move(fastest));
                }
              }
            }
          }
          if (!any_fits && smallest >= 0) plan.rejected.push_back(std::move(best_of_family));
        }
      }
    }
  }
  std::sort(plan.ranked.begin(), plan.ranked.end(), [](const LayoutPlan& a, const LayoutPlan& b) {
    return std::tie(a.time.step, a.memory.device) < std::tie(b.time.step, b.memory.device);
  });
  if (!plan.ranked.empty()) {
    const double best = plan.ranked.front().time.step;
    for (auto& p : plan.ranked)
      if (p.time.step > best)
        p.reason = fmt::format("{:.0f}% slower than the best", 100.0 * (p.time.step / best - 1.0));
  }
  try {
    LayoutPlan own = evaluate_layout(cfg, cluster, layout_of(cfg, world));
    own.fits = own.memory.device <= usable;
    own.largest_micro_batch =
        largest_fitting_micro_batch(cfg, cluster, own.layout, usable, global_batch / own.layout.dp, options);
    if (own.fits && !plan.ranked.empty() && own.time.step > plan.ranked.front().time.step)
      own.reason =
          fmt::format("{:.0f}% slower than the best", 100.0 * (own.time.step / plan.ranked.front().time.step - 1.0));
    plan.recipe_layout = std::move(own);
  } catch (const ConfigError& e) {
    LayoutPlan own;
    own.reason = e.what();
    plan.recipe_layout = std::move(own);
  }
  return plan;
}

}  // namespace tide

namespace tide {

LayoutChoice choose_layout(const RunConfig& cfg, const Cluster& cluster, const PlanOptions& options) {
  const Plan plan = plan_layouts(cfg, cluster, options);
  if (plan.ranked.empty()) {
    // The family that came closest to fitting, with its shortfall.
    const LayoutPlan* closest = nullptr;
    for (const auto& p : plan.rejected)
      if (p.memory.device > 0 && (!closest || p.memory.device < closest->memory.device)) closest = &p;
    throw ConfigError("parallel.auto", closest
                                           ? fmt::format("no layout of {} ranks fits: the closest, {}, {}",
                                                         cluster.world(), closest->layout.describe(), closest->reason)
                                           : fmt::format("no layout of {} ranks can run this model", cluster.world()));
  }
  LayoutChoice c;
  c.chosen = plan.ranked.front();
  if (plan.ranked.size() > 1) c.runner_up = plan.ranked[1];
  const auto& l = c.chosen.layout;
  c.explanation = fmt::format(
      "parallel.auto chose {} for {} ranks of {}: {:.3g} s per step, {:.0f} tokens/s, {} "
      "per rank of {}",
      l.describe(), cluster.world(), cluster.device.name, c.chosen.time.step, c.chosen.time.tokens_per_second,
      gib(c.chosen.memory.device), gib(cluster.device.memory_bytes));
  if (c.runner_up)
    c.explanation += fmt::format("; runner-up {} ({:.1f}% slower)", c.runner_up->layout.describe(),
                                 100.0 * (c.runner_up->time.step / c.chosen.time.step - 1.0));
  c.explanation += fmt::format("; {} layouts fit, {} families refused", plan.ranked.size(), plan.rejected.size());
  c.overrides = {"parallel.auto=false",
                 fmt::format("parallel.dp={}", l.dp),
                 fmt::format("parallel.tp={}", l.tp),
                 fmt::format("parallel.pp={}", l.pp),
                 fmt::format("parallel.cp={}", l.cp),
                 fmt::format("parallel.cp_comm={}", l.cp_comm),
                 fmt::format("parallel.ep={}", l.ep),
                 fmt::format("parallel.zero={}", l.zero),
                 fmt::format("parallel.offload_optimizer={}", l.offload),
                 fmt::format("parallel.sequence_parallel={}", l.sequence_parallel),
                 fmt::format("parallel.pipeline_schedule={}", l.schedule),
                 fmt::format("parallel.virtual_stages={}", l.virtual_stages),
                 "parallel.micro_batches=0",
                 fmt::format("batch.micro_batch={}", l.micro_batch),
                 fmt::format("model.activation_checkpointing={}", l.activation_checkpointing),
                 fmt::format("model.recompute_blocks={}", l.recompute_blocks)};
  return c;
}

}  // namespace tide
