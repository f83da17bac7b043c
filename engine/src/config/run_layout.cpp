#include "tide/engine/run_layout.h"

#include <fmt/format.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/model/pipeline_stage.h"
#include "tide/engine/parallel/grid.h"

namespace tide {

void check_tensor_parallel(const ModelConfig& m, int64_t tp, bool sequence_parallel, int64_t seq_len) {
  if (tp <= 1) return;
  if (m.n_heads % tp != 0)
    throw ConfigError("parallel.tp", fmt::format("{} does not divide model.n_heads = {}", tp, m.n_heads));
  const int64_t kv = resolved_kv_heads(m);
  if (kv % tp != 0 && tp % kv != 0)
    throw ConfigError("parallel.tp", fmt::format("{} and model.n_kv_heads = {} must divide one another (key/value "
                                                 "heads are split, or replicated when fewer than tp)",
                                                 tp, kv));
  if (resolved_ffn_dim(m) % tp != 0)
    throw ConfigError("parallel.tp",
                      fmt::format("{} does not divide the MLP width {} (model.ffn_dim)", tp, resolved_ffn_dim(m)));
  if (sequence_parallel && seq_len % tp != 0)
    throw ConfigError("parallel.sequence_parallel",
                      fmt::format("data.seq_len = {} does not divide into tp = {} parts", seq_len, tp));
}

void check_context_parallel(const RunConfig& cfg, int64_t cp) {
  if (cp <= 1) return;
  const int64_t t = cfg.data.seq_len, tp = cfg.parallel.tp;
  if (t % (2 * cp) != 0)
    throw ConfigError("parallel.cp",
                      fmt::format("{} cuts each sequence into 2 x cp = {} equal chunks, and data.seq_len "
                                  "= {} does not divide into them",
                                  cp, 2 * cp, t));
  if (cfg.parallel.cp_comm == "all_to_all") {
    const ModelConfig& m = cfg.model;
    const int64_t heads = m.n_heads / tp, kv = resolved_kv_heads(m);
    const int64_t kv_heads = kv % tp == 0 ? kv / tp : 1;  // fewer than tp: one held by each rank
    if (!context_heads_split(heads, kv_heads, cp))
      throw ConfigError("parallel.cp_comm",
                        fmt::format("\"all_to_all\" splits each tensor-parallel rank's {} query and {} key/value "
                                    "heads (model.n_heads = {}, n_kv_heads = {}, tp = {}) over cp = {} ranks: cp must "
                                    "divide the query heads, and divide or be a multiple of the key/value heads; "
                                    "\"all_gather\" takes any",
                                    heads, kv_heads, m.n_heads, kv, tp, cp));
  }
  if (cfg.parallel.sequence_parallel && tp > 1 && (t / cp) % tp != 0)
    throw ConfigError("parallel.sequence_parallel",
                      fmt::format("each context-parallel rank's {} tokens (data.seq_len = {} over parallel.cp = {}) do "
                                  "not divide into tp = {} parts",
                                  t / cp, t, cp, tp));
}

void check_mixture_of_experts(const RunConfig& cfg, int64_t cp, int64_t tp) {
  const int64_t experts = cfg.model.moe_experts;
  if (experts == 0) return;
  if (cp > 1)
    throw ConfigError("model.moe_experts",
                      fmt::format("{} experts: not yet under context parallelism (cp = {})", experts, cp));
  if (tp > 1 && cfg.parallel.sequence_parallel)
    throw ConfigError("parallel.sequence_parallel",
                      fmt::format("a mixture of experts (model.moe_experts = {}) runs under tensor parallelism "
                                  "without sequence parallelism (tp = {})",
                                  experts, tp));
  if (tp > 1 && cfg.model.mlp_bias)
    throw ConfigError("model.mlp_bias", fmt::format("experts with biases (model.moe_experts = {}) under tensor "
                                                    "parallelism (tp = {}) are not supported",
                                                    experts, tp));
}

void check_expert_parallel(const RunConfig& cfg, int64_t dp) {
  const int64_t ep = cfg.parallel.ep, experts = cfg.model.moe_experts;
  if (ep <= 1) return;
  if (experts == 0)
    throw ConfigError("parallel.ep", fmt::format("{} spreads the experts of a mixture of experts, and the model has "
                                                 "none (model.moe_experts = 0)",
                                                 ep));
  if (experts % ep != 0)
    throw ConfigError("parallel.ep", fmt::format("{} does not divide model.moe_experts = {}", ep, experts));
  if (dp % ep != 0)
    throw ConfigError("parallel.ep",
                      fmt::format("{} does not divide the data-parallel degree dp = {}: the experts are spread over ep "
                                  "of the dp ranks",
                                  ep, dp));
}

namespace {
// What interleaved 1F1B (parallel.virtual_stages > 1) asks of the rest of the layout.
void check_interleaving(const RunConfig& cfg, int pp, int dp) {
  const int64_t v = cfg.parallel.virtual_stages;
  if (cfg.parallel.pipeline_schedule != "1f1b")
    throw ConfigError("parallel.pipeline_schedule",
                      fmt::format("'{}' does not interleave: parallel.virtual_stages = {} runs interleaved 1F1B "
                                  "(pipeline_schedule = \"1f1b\")",
                                  cfg.parallel.pipeline_schedule, v));
  // The schedule takes the micro-batches in groups of pp, each group through every chunk
  // (Megatron's condition too).
  const int64_t micro_batches = accumulation_steps(cfg.batch.global_batch, {dp, micro_batch_size(cfg, dp)});
  if (micro_batches % pp != 0)
    throw ConfigError("parallel.virtual_stages",
                      fmt::format("interleaved 1F1B takes the micro-batches in groups of pp = {}, and a step has {} "
                                  "(set parallel.micro_batches to a multiple of {})",
                                  pp, micro_batches, pp));
}
}  // namespace

void check_supported_layout(const RunConfig& cfg, int world) {
  const Grid grid(world, 0, static_cast<int>(cfg.parallel.dp), static_cast<int>(cfg.parallel.tp),
                  static_cast<int>(cfg.parallel.pp), static_cast<int>(cfg.parallel.cp));
  check_context_parallel(cfg, grid.cp());
  check_tensor_parallel(cfg.model, grid.tp(), cfg.parallel.sequence_parallel, cfg.data.seq_len / grid.cp());
  check_mixture_of_experts(cfg, grid.cp(), grid.tp());
  check_expert_parallel(cfg, grid.dp());
  const int64_t virtual_stages = cfg.parallel.virtual_stages;
  if (virtual_stages > 1 && grid.pp() == 1)
    throw ConfigError("parallel.virtual_stages",
                      fmt::format("{} chunks per pipeline rank need pipeline parallelism (pp > 1); pp = 1 runs the "
                                  "whole model as one",
                                  virtual_stages));
  if (grid.pp() > 1 || !cfg.parallel.pipeline_stages.empty())  // the stages can be cut
    partition_stages(cfg.model, grid.pp(), cfg.data.seq_len, cfg.parallel.pipeline_stages, virtual_stages,
                     cfg.data.document_attention);
  if (grid.pp() > 1) {
    if (cfg.parallel.zero == 3)
      throw ConfigError("parallel.zero", fmt::format("ZeRO-3 does not combine with pipeline parallelism (pp = {}): "
                                                     "a stage already holds only its blocks; use ZeRO-1 or 2",
                                                     grid.pp()));
  }
  if (cfg.parallel.micro_batches > 0 && cfg.batch.global_batch % (cfg.parallel.micro_batches * grid.dp()) != 0)
    throw ConfigError("parallel.micro_batches",
                      fmt::format("{} micro-batches on each of dp = {} ranks do not divide batch.global_batch = {}",
                                  cfg.parallel.micro_batches, grid.dp(), cfg.batch.global_batch));
  check_global_batch(cfg.batch.global_batch, {grid.dp(), micro_batch_size(cfg, grid.dp())});
  if (virtual_stages > 1) check_interleaving(cfg, grid.pp(), grid.dp());
  for (int64_t rank : cfg.profile.ranks)
    if (rank >= world)
      throw ConfigError("profile.ranks",
                        fmt::format("rank {} is not in this job of {} rank{}", rank, world, world == 1 ? "" : "s"));
}

int64_t micro_batch_size(const RunConfig& cfg, int dp) {
  if (cfg.parallel.micro_batches > 0) return cfg.batch.global_batch / (cfg.parallel.micro_batches * dp);
  return cfg.batch.micro_batch;
}

BatchLayout batch_layout(const RunConfig& cfg, int world) {
  const Grid grid(world, 0, static_cast<int>(cfg.parallel.dp), static_cast<int>(cfg.parallel.tp),
                  static_cast<int>(cfg.parallel.pp), static_cast<int>(cfg.parallel.cp));
  return {grid.dp(), micro_batch_size(cfg, grid.dp()), grid.cp()};
}

void check_global_batch(int64_t global_batch, const BatchLayout& layout) {
  if (global_batch % (layout.micro_batch * layout.dp) != 0)
    throw ConfigError("batch.global_batch", fmt::format("{} is not a multiple of the micro-batch x dp = {} x {}",
                                                        global_batch, layout.micro_batch, layout.dp));
}

int64_t accumulation_steps(int64_t global_batch, const BatchLayout& layout) {
  return global_batch / (layout.micro_batch * layout.dp);
}

}  // namespace tide
