// The planner's arithmetic on the bundled recipes: what each rank holds follows the
// engine's buffers, sharding and recomputation move memory where they should, layouts
// that cannot run are refused with the reason, the ranking is ordered. (How close the
// predictions come to measured peaks and step times: bench/plan_vs_measured.py, whose
// memory check is parallel.plan_memory.)
#include <sched.h>

#include <algorithm>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../../engine/src/plan/rank_model.h"
#include "tide/engine/config_schema.h"
#include "tide/engine/model/pipeline_stage.h"
#include "tide/engine/plan/cluster.h"
#include "tide/engine/plan/plan.h"
#include "tide/engine/train/flops.h"
#include "tide/scripting/recipe.h"

namespace tide {
namespace {

RunConfig recipe(const std::string& name, const std::vector<std::string>& overrides = {}) {
  return Recipe::load_file(std::string(TIDE_SOURCE_DIR) + "/recipes/" + name + ".lua", overrides).config();
}

// Data parallelism over `dp` ranks, one sequence a micro-batch, `micro_batches` a step.
PlanLayout one_sequence_micro_batches(int dp, int64_t micro_batches) {
  PlanLayout l;
  l.dp = dp;
  l.micro_batch = 1;
  l.micro_batches = micro_batches;
  return l;
}

Cluster h100(int nodes, int per_node) {
  Cluster c;
  c.device = find_device("h100-80");
  c.nodes = nodes;
  c.devices_per_node = per_node;
  return c;
}

// A CPU-like device with fixed figures, so the arithmetic below does not depend on the
// machine the test runs on.
Cluster fixed_host(int ranks, double gib) {
  Cluster c;
  c.device.name = "test-host";
  c.device.host = true;
  c.device.memory_bytes = gib * 1024 * 1024 * 1024;
  c.device.fp32_flops = c.device.bf16_flops = 100e9;
  c.device.memory_bandwidth = 20e9;
  c.device.intra_node_bandwidth = c.device.inter_node_bandwidth = c.device.host_link_bandwidth = 5e9;
  c.devices_per_node = ranks;
  return c;
}

TEST(Plan, RankModelAddsUpToTheModel) {
  for (const char* name :
       {"llama/llama-tiny", "llama/llama-2-70b", "llama/llama-3-8b", "bloom/bloom-560m", "bloom/bloom-tiny",
        "mixtral/mixtral-tiny", "mixtral/mixtral-8x7b", "qwen/qwen1.5-moe-a2.7b"}) {
    const ModelConfig m = recipe(name).model;
    const auto whole = plan::rank_model(m, 1, PipelineStage{});
    EXPECT_EQ(whole.padded_elements(1), parameter_count(m)) << name;
    // Pipeline stages hold every block once; the last stage's copy of tied embeddings is extra.
    for (const int64_t pp : {2, 4}) {
      int64_t total = 0;
      for (const auto& stage : partition_stages(m, pp, 256)) {
        const auto r = plan::rank_model(m, 1, stage);
        total += r.padded_elements(1);
      }
      EXPECT_EQ(total, parameter_count(m) + (m.tie_embeddings ? m.vocab_size * m.dim : 0)) << name << " pp" << pp;
    }
    // Tensor parallelism splits every matmul weight (key/value heads divide tp here) but a
    // shared expert's gate, [1, dim], held whole.
    const auto half = plan::rank_model(m, 2, PipelineStage{});
    EXPECT_EQ(2 * half.block_matmul - (m.moe_shared_gate ? m.dim : 0), whole.block_matmul) << name;
  }
}

// A mixture of experts: ep ranks hold every expert once between them, in flat buffers
// of their own; a token multiplies by the router and its top k experts, which is what
// the model-FLOPs count charges it (norms aside).
TEST(Plan, RankModelSpreadsTheExpertsOverTheExpertParallelRanks) {
  const ModelConfig m = recipe("mixtral/mixtral-8x7b").model;
  const auto whole = plan::rank_model(m, 1, PipelineStage{});
  EXPECT_EQ(whole.experts, 8);
  EXPECT_FALSE(whole.experts_apart);
  EXPECT_TRUE(whole.expert_units(1).empty());
  for (const int64_t ep : {2, 4, 8}) {
    const auto r = plan::rank_model(m, 1, PipelineStage{}, ep);
    EXPECT_EQ(r.experts, 8 / ep);
    ASSERT_TRUE(r.experts_apart);
    EXPECT_EQ(r.expert_units(1).front(), 0) << "unit 0 holds no expert";
    EXPECT_EQ(r.padded_elements(1) + ep * r.expert_padded_elements(1), parameter_count(m)) << "ep" << ep;
    // Padded for the ranks that hold the same experts.
    EXPECT_EQ(r.expert_block_unit(3) % 3, 0);
    EXPECT_GE(r.expert_block_unit(3), r.block_expert_elements());
  }
  const double matmul_per_token = 6.0 * static_cast<double>(m.n_layers * whole.block_token_weights + whole.head_matmul);
  double attention = 0;
  for (int64_t layer = 0; layer < m.n_layers; ++layer)
    attention += 12.0 * static_cast<double>(m.n_heads * head_dim(m)) * counted_keys(m, layer, 4096);
  EXPECT_NEAR(matmul_per_token + attention, train_flops_per_token(m, 4096), 1e-4 * train_flops_per_token(m, 4096));
}

TEST(Plan, OneProcessHoldsTheFlatBuffersAndAdamMoments) {
  const RunConfig cfg = recipe("llama/llama-tiny", {"checkpoint.async=false"});
  const LayoutPlan p = evaluate_layout(cfg, fixed_host(1, 16), layout_of(cfg, 1));
  const double bytes = 4.0 * static_cast<double>(parameter_count(cfg.model));
  EXPECT_DOUBLE_EQ(p.memory.parameters, bytes);
  EXPECT_DOUBLE_EQ(p.memory.gradients, bytes);
  EXPECT_DOUBLE_EQ(p.memory.optimizer, 2 * bytes);
  EXPECT_EQ(p.memory.working_copy, 0.0) << "fp32 compute casts nothing";
  // The loss keeps the gradients it made in its forward: its input's (8 x 256 tokens of
  // dim 256) and the output weight's (8192 x 256), in fp32; never the logits.
  EXPECT_DOUBLE_EQ(p.memory.loss, 4.0 * (8 * 256 + 8192) * 256);
  EXPECT_EQ(p.memory.activations_by_block.size(), 4u);
  EXPECT_GT(p.time.step, 0.0);
  EXPECT_TRUE(p.fits);
}

TEST(Plan, ShardingRecomputationAndOffloadMoveMemoryWhereTheEngineDoes) {
  const RunConfig cfg = recipe("llama/llama-3-8b");
  const Cluster cluster = h100(1, 8);
  PlanLayout l = one_sequence_micro_batches(8, 64);
  std::vector<double> by_stage;
  for (int zero = 0; zero <= 3; ++zero) {
    l.zero = zero;
    by_stage.push_back(evaluate_layout(cfg, cluster, l).memory.device);
  }
  EXPECT_TRUE(std::is_sorted(by_stage.rbegin(), by_stage.rend())) << "each ZeRO stage holds less";
  l.zero = 1;
  const LayoutPlan plain = evaluate_layout(cfg, cluster, l);
  l.activation_checkpointing = true;
  const LayoutPlan ckpt = evaluate_layout(cfg, cluster, l);
  EXPECT_LT(ckpt.memory.activations, plain.memory.activations / 5);
  EXPECT_GT(ckpt.time.recompute, 0.0);
  EXPECT_GT(ckpt.time.step, plain.time.step);
  l.offload = true;
  const LayoutPlan off = evaluate_layout(cfg, cluster, l);
  EXPECT_EQ(off.memory.optimizer, 0.0);
  EXPECT_DOUBLE_EQ(off.memory.host, 2 * ckpt.memory.optimizer) << "moments, master and gradient copies on the host";
  // Sequence parallelism splits the norms' inputs over tp ranks.
  PlanLayout t;
  t.dp = 4;
  t.tp = 2;
  t.micro_batches = 128;
  const LayoutPlan no_sp = evaluate_layout(cfg, cluster, t);
  t.sequence_parallel = true;
  EXPECT_LT(evaluate_layout(cfg, cluster, t).memory.activations, no_sp.memory.activations);
  EXPECT_GT(no_sp.time.tp_comm, 0.0);
}

// Context parallelism: each rank holds half of each sequence's activations (and the keys
// and values of the whole sequence), ZeRO shards over the dp x cp ranks, the keys and
// values travel every block; the planner weighs it only where nothing fits without it.
TEST(Plan, ContextParallelismSplitsActivationsAndIsWeighedWhereNothingElseFits) {
  const RunConfig cfg = recipe("llama/llama-3-8b");
  const Cluster cluster = h100(1, 8);
  PlanLayout dp8 = one_sequence_micro_batches(8, 64);
  dp8.zero = 1;
  PlanLayout cp2 = one_sequence_micro_batches(4, 128);
  cp2.zero = 1;
  cp2.cp = 2;
  const LayoutPlan whole = evaluate_layout(cfg, cluster, dp8), halves = evaluate_layout(cfg, cluster, cp2);
  EXPECT_LT(halves.memory.activations, 0.6 * whole.memory.activations);
  EXPECT_DOUBLE_EQ(halves.memory.optimizer, whole.memory.optimizer) << "ZeRO-1 shards over dp x cp = 8 ranks";
  EXPECT_EQ(whole.time.cp_comm, 0.0);
  EXPECT_GT(halves.time.cp_comm, 0.0);
  EXPECT_EQ(halves.layout.describe(), "dp4 tp1 pp1 zero1 mb1x128 cp2");

  // Asked for, only layouts of that cp; by default none where a layout without it fits.
  PlanOptions two;
  two.cp = 2;
  const Plan asked = plan_layouts(cfg, cluster, two);
  ASSERT_FALSE(asked.ranked.empty());
  for (const auto& p : asked.ranked) EXPECT_EQ(p.layout.cp, 2);
  for (const auto& p : plan_layouts(cfg, cluster).ranked) EXPECT_EQ(p.layout.cp, 1);

  // One wide block of 3 heads on 2 H100s, 2 sequences of 8,192 tokens a step: neither
  // tensor nor pipeline parallelism can cut it, data parallelism holds a whole sequence
  // a rank, cp = 2 half of one. With less memory than any layout without cp needs, but
  // enough for one with it, the plan ranks layouts of cp = 2 alone.
  const RunConfig wide =
      recipe("llama/llama-tiny",
             {"model.vocab_size=256", "model.dim=3072", "model.n_layers=1", "model.n_heads=3", "model.n_kv_heads=3",
              "model.max_seq_len=8192", "data.seq_len=8192", "batch.global_batch=2", "batch.micro_batch=1"});
  PlanOptions one_sequence;
  one_sequence.max_micro_batch = 1;
  const auto least = [&](int cp) {
    PlanOptions only = one_sequence;
    only.cp = cp;
    double most = 1e30;
    for (const auto& p : plan_layouts(wide, h100(1, 2), only).ranked) most = std::min(most, p.memory.device);
    return most;
  };
  const double without = least(1), with = least(2);
  ASSERT_LT(with, without);
  Cluster tight = h100(1, 2);
  tight.device.memory_bytes = (with + without) / 2;
  const Plan plan = plan_layouts(wide, tight, one_sequence);
  ASSERT_FALSE(plan.ranked.empty());
  for (const auto& p : plan.ranked) EXPECT_EQ(p.layout.cp, 2) << p.layout.describe();
  // The choice reaches a run's overrides.
  const LayoutChoice c = choose_layout(wide, tight, one_sequence);
  EXPECT_NE(std::find(c.overrides.begin(), c.overrides.end(), "parallel.cp=2"), c.overrides.end());
}

// The all-to-all form of context parallelism: per block and token of its own it sends
// 2 (2 H + 2 K) Hd (cp - 1) / cp values where the all-gather form sends 6 K Hd (cp - 1):
// for Llama 3 8B (H = 32, K = 8, Hd = 128) 10,240 against 6,144 at cp = 2, 17,920 against
// 43,008 at cp = 8. A masked block (BLOOM's ALiBi) keeps no gathered keys and values: per
// token of its own 5 H Hd (the exchanged q, k, v of its heads and the output twice)
// where the all-gather form keeps 9 H Hd at cp = 2 (BLOOM's fused q, k, v, the output,
// the gathered keys and values, the chunks' outputs). The plan weighs both forms; heads
// that do not split over cp refuse the all-to-all form, naming it.
TEST(Plan, AllToAllContextParallelismExchangesHeadsForTokens) {
  const RunConfig cfg = recipe("llama/llama-3-8b");
  const auto comm_seconds = [&](int cp, const std::string& form) {
    PlanLayout l = one_sequence_micro_batches(64 / cp, 512 / (64 / cp));
    l.cp = cp;
    l.cp_comm = form;
    return evaluate_layout(cfg, h100(8, 8), l).time.cp_comm;
  };
  EXPECT_GT(comm_seconds(2, "all_to_all"), comm_seconds(2, "all_gather"));
  EXPECT_LT(comm_seconds(8, "all_to_all"), comm_seconds(8, "all_gather"));

  const RunConfig bloom = recipe("bloom/bloom-7b1", {"data.seq_len=8192", "model.max_seq_len=8192"});
  PlanLayout gathered = one_sequence_micro_batches(4, 128);
  gathered.cp = 2;
  PlanLayout exchanged = gathered;
  exchanged.cp_comm = "all_to_all";
  EXPECT_EQ(exchanged.describe(), "dp4 tp1 pp1 zero0 mb1x128 cp2 a2a");
  const LayoutPlan g = evaluate_layout(bloom, h100(1, 8), gathered), x = evaluate_layout(bloom, h100(1, 8), exchanged);
  const double per_head_token = 4096.0 * 2 * 4096;  // N H Hd s: 4,096 tokens a rank, H Hd = 4096, bf16
  EXPECT_NEAR(g.memory.activations_by_block[0] - x.memory.activations_by_block[0], 4 * per_head_token,
              0.01 * per_head_token);

  PlanOptions two;
  two.cp = 2;
  const Plan asked = plan_layouts(cfg, h100(1, 8), two);
  const auto forms = [](const std::vector<LayoutPlan>& plans, const std::string& form) {
    return std::count_if(plans.begin(), plans.end(), [&](const LayoutPlan& p) { return p.layout.cp_comm == form; });
  };
  EXPECT_GT(forms(asked.ranked, "all_gather"), 0);
  EXPECT_GT(forms(asked.ranked, "all_to_all"), 0);
  // 3 heads do not split over 2 ranks: the all-gather form alone.
  const RunConfig three = recipe("llama/llama-tiny", {"model.n_heads=3", "model.n_kv_heads=3", "model.dim=192"});
  const Plan odd = plan_layouts(three, h100(1, 2), two);
  EXPECT_GT(forms(odd.ranked, "all_gather"), 0);
  EXPECT_EQ(forms(odd.ranked, "all_to_all"), 0);
  const bool refused = std::any_of(odd.rejected.begin(), odd.rejected.end(), [](const LayoutPlan& p) {
    return p.layout.cp_comm == "all_to_all" && p.reason.find("parallel.cp_comm") != std::string::npos;
  });
  EXPECT_TRUE(refused);
}

// LoRA holds the frozen weights and the adapters' gradients and moments alone (sharded
// under ZeRO-1/2 as the flat buffers are); under tensor parallelism a rank holds its
// part of each adapter (a column layer's B, a row layer's A split); ZeRO-3 holds a piece
// of the frozen weights too; the planner offers every layout it trains under.
TEST(Plan, LoraHoldsTheWeightsAndTheGradientsAndMomentsOfItsAdaptersAlone) {
  const RunConfig cfg = recipe("llama/llama-3-8b", {"model.lora_rank=16", "precision.compute=fp32"});
  const double P = static_cast<double>(parameter_count(cfg.model));
  const double A = static_cast<double>(lora_parameter_count(cfg.model));
  // rank 16 on the 7 projections of 32 blocks: 16 (in + out) each.
  const int64_t d = 4096, kv = 1024, f = 14336;
  EXPECT_EQ(A, 32.0 * 16 * ((d + d) + 2 * (d + kv) + (d + d) + 2 * (d + f) + (f + d)));
  PlanLayout l;
  l.dp = 2;
  l.micro_batch = 1;
  l.micro_batches = 32;
  l.zero = 2;
  const LayoutPlan p = evaluate_layout(cfg, h100(1, 2), l);
  EXPECT_DOUBLE_EQ(p.memory.parameters, 4 * P);
  EXPECT_DOUBLE_EQ(p.memory.gradients, 4 * A / 2);
  EXPECT_DOUBLE_EQ(p.memory.optimizer, 2 * 4 * A / 2);
  l.zero = 3;
  const LayoutPlan z3 = evaluate_layout(cfg, h100(1, 2), l);
  EXPECT_NEAR(z3.memory.parameters, 4 * P / 2, 4 * 40);  // each of 34 units padded by at most 1
  EXPECT_DOUBLE_EQ(z3.memory.gradients, 4 * A / 2);
  EXPECT_DOUBLE_EQ(z3.memory.optimizer, 2 * 4 * A / 2);
  EXPECT_GT(z3.memory.gathered, 0.0);
  // tp2: q, k, v, gate, up split their B (out / 2), o and down their A (in / 2).
  const int64_t split_elements =
      int64_t{32} * 16 * ((d + d / 2) + 2 * (d + kv / 2) + (d / 2 + d) + 2 * (d + f / 2) + (f / 2 + d));
  EXPECT_EQ(lora_rank_parameter_count(cfg.model, 2, 32), split_elements);
  const auto split = static_cast<double>(split_elements);
  PlanLayout t;
  t.tp = 2;
  t.micro_batch = 1;
  t.micro_batches = 64;
  const LayoutPlan tp2 = evaluate_layout(cfg, h100(1, 2), t);
  EXPECT_DOUBLE_EQ(tp2.memory.gradients, 4 * split);
  EXPECT_DOUBLE_EQ(tp2.memory.optimizer, 2 * 4 * split);
  const Plan plan = plan_layouts(cfg, h100(1, 2));
  ASSERT_FALSE(plan.ranked.empty());
  bool cut = false, zero3 = false;
  for (const auto& r : plan.ranked) {
    zero3 = zero3 || r.layout.zero == 3;
    cut = cut || r.layout.tp > 1 || r.layout.pp > 1;
  }
  EXPECT_TRUE(cut) << "no tensor- or pipeline-parallel layout offered";
  EXPECT_TRUE(zero3) << "no ZeRO-3 layout offered";
}

// Under bf16 LoRA holds its frozen matrices in bf16 (parallelize.h), the embeddings and
// norms in fp32, and casts only its adapters; ZeRO-3 holds its pieces of the base in bf16.
TEST(Plan, LoraUnderBf16HoldsItsFrozenMatricesInBf16) {
  const RunConfig cfg = recipe("llama/llama-3-8b", {"model.lora_rank=16", "precision.compute=bf16"});
  const double P = static_cast<double>(parameter_count(cfg.model));  // the adapters' too
  const double A = static_cast<double>(lora_parameter_count(cfg.model));
  const int64_t d = 4096, kv = 1024, f = 14336, vocab = 128256;
  const double matrices = 32.0 * (d * d + 2 * d * kv + d * d + 3 * d * f) + static_cast<double>(vocab * d);
  PlanLayout l;
  l.dp = 2;
  l.micro_batch = 1;
  l.micro_batches = 32;
  l.zero = 2;
  const LayoutPlan z2 = evaluate_layout(cfg, h100(1, 2), l);
  EXPECT_DOUBLE_EQ(z2.memory.parameters, 4 * P - 2 * matrices);
  EXPECT_DOUBLE_EQ(z2.memory.working_copy, 2 * A);
  l.zero = 3;
  const LayoutPlan z3 = evaluate_layout(cfg, h100(1, 2), l);
  EXPECT_NEAR(z3.memory.parameters, (2 * (P - A) + 4 * A) / 2, 2 * 40);  // each of 34 units padded by at most 1
  EXPECT_DOUBLE_EQ(z3.memory.working_copy, 2 * A);
}

// Each adapter keeps its rank-wide product, and under lora_dropout its dropped input and
// the scaled mask, 2 bytes each an element under bf16 (layers.cpp): on LLaMA-3 8B's seven
// projections the inputs are 5 of width D (q, k, v, gate, up), the attention's output (D
// wide) and the MLP's product (F), which an undropped down projection's A keeps already.
TEST(Plan, LoraDropoutKeepsEachAdaptersDroppedInputAndItsMask) {
  PlanLayout l;
  l.micro_batch = 1;
  l.micro_batches = 512;
  const auto activations = [&](const std::vector<std::string>& set) {
    return evaluate_layout(recipe("llama/llama-3-8b", set), h100(1, 1), l).memory.activations;
  };
  const double full = activations({}), lora = activations({"model.lora_rank=16"}),
               dropped = activations({"model.lora_rank=16", "model.lora_dropout=0.1"});
  const double N = 8192, s = 2, d = 4096, f = 14336, blocks = 32;
  EXPECT_DOUBLE_EQ(lora - full, blocks * N * s * (7 * 16 + f));
  EXPECT_DOUBLE_EQ(dropped - lora, blocks * N * s * (2 * (6 * d + f) - f));
}

// ZeRO-3 under bf16 compute gathers in bf16 and holds what it gathered in bf16: a third
// less traffic than in fp32 (the reduce-scatters stay fp32); the running block takes 2
// bytes a weight, its norms widened to 4 beside it, the block arriving 2, beside this
// rank's piece cast for it; and no weight is cast (the untied head neither).
TEST(Plan, Zero3GathersInTheComputeDtype) {
  PlanLayout l;
  l.dp = 8;
  l.zero = 3;
  l.micro_batch = 1;
  l.micro_batches = 64;
  const Cluster cluster = h100(1, 8);
  const LayoutPlan fp32 = evaluate_layout(recipe("llama/llama-3-8b", {"precision.compute=fp32"}), cluster, l);
  const LayoutPlan bf16 = evaluate_layout(recipe("llama/llama-3-8b", {"precision.compute=bf16"}), cluster, l);
  // fp32: M reduce-scatters and 2 M gathers of the padded model; bf16: the gathers at half
  // the bytes. Each ring's latency is the same in both, a few microseconds of seconds.
  EXPECT_NEAR(bf16.time.dp_comm_total / fp32.time.dp_comm_total, 2.0 / 3.0, 0.01);
  const auto r = plan::rank_model(recipe("llama/llama-3-8b").model, 1, PipelineStage{});
  const double block = static_cast<double>(r.largest_block_unit(8));
  EXPECT_DOUBLE_EQ(fp32.memory.gathered - bf16.memory.gathered,
                   block * (4 - 2.0 / 8) - 4 * static_cast<double>(r.block_widened));
  EXPECT_EQ(r.block_widened, 2 * r.dim) << "a LLaMA block widens its two norms";
  EXPECT_EQ(bf16.memory.working_copy, 0.0) << "the gathered units are the weights' copies";
}

// Eight ranks as two replicas of four pipeline stages, each taking 16 micro-batches of one.
PlanLayout dp2_pp4_micro_batches_16() {
  PlanLayout l;
  l.pp = 4;
  l.dp = 2;
  l.micro_batch = 1;
  l.micro_batches = 16;
  return l;
}

TEST(Plan, PipelineStageZeroHoldsTheMostMicroBatchesUnder1F1B) {
  const RunConfig cfg = recipe("llama/llama-2-13b");
  PlanLayout l = dp2_pp4_micro_batches_16();
  const LayoutPlan one_f_one_b = evaluate_layout(cfg, h100(1, 8), l);
  l.schedule = "gpipe";
  const LayoutPlan gpipe = evaluate_layout(cfg, h100(1, 8), l);
  EXPECT_GT(gpipe.memory.activations, 3 * one_f_one_b.memory.activations) << "GPipe keeps all 16, 1F1B at most 4";
  EXPECT_GT(one_f_one_b.time.bubble, 0.0);
}

TEST(Plan, InterleavingShrinksTheBubbleForMoreMessagesAndFirstStageActivations) {
  const RunConfig cfg = recipe("llama/llama-2-13b");  // 40 blocks
  PlanLayout l = dp2_pp4_micro_batches_16();
  const LayoutPlan plain = evaluate_layout(cfg, h100(1, 8), l);
  l.virtual_stages = 2;
  const LayoutPlan interleaved = evaluate_layout(cfg, h100(1, 8), l);
  EXPECT_EQ(interleaved.layout.describe(), "dp2 tp1 pp4 zero0 mb1x16 1f1b v2");
  // The same stages through half as much fill and drain: the bubble halves, up to the
  // stages' message time, which doubles (each chunk's boundary).
  EXPECT_NEAR(interleaved.time.pp_comm, 2 * plain.time.pp_comm, 1e-12 * plain.time.pp_comm);
  EXPECT_LT(interleaved.time.bubble, 0.55 * plain.time.bubble);
  EXPECT_GT(interleaved.time.bubble, 0.45 * plain.time.bubble);
  EXPECT_LT(interleaved.time.step, plain.time.step);
  // Stage 0 holds 2 (pp - 1) + (V - 1) pp + 1 = 11 half-stage micro-batches against
  // 1F1B's 4 whole ones: 1 + (pp - 1) / (pp V) = 1.375 times the activations, less the
  // chunks' unequal share of the token ids and held outputs.
  EXPECT_EQ(interleaved.memory.peak_stage, 0);
  const double ratio = interleaved.memory.activations / plain.memory.activations;
  EXPECT_GT(ratio, 1.3) << ratio;
  EXPECT_LT(ratio, 1.45) << ratio;
  // The planner weighs interleaving where it can run: micro-batches in groups of pp,
  // enough blocks; with ZeRO-2 too.
  const Plan plan = plan_layouts(cfg, h100(1, 8));
  bool weighed = false, with_zero2 = false;
  for (const auto& p : plan.ranked) {
    if (p.layout.virtual_stages == 1) continue;
    weighed = true;
    with_zero2 |= p.layout.zero == 2;
    EXPECT_GT(p.layout.pp, 1) << p.layout.describe();
    EXPECT_EQ(p.layout.micro_batches % p.layout.pp, 0) << p.layout.describe();
    EXPECT_LE(p.layout.pp * p.layout.virtual_stages, cfg.model.n_layers) << p.layout.describe();
  }
  EXPECT_TRUE(weighed);
  EXPECT_TRUE(with_zero2);
}

TEST(Plan, RecomputesTheFewestBlocksOfEachStageThatFit) {
  RunConfig cfg = recipe("llama/llama-2-13b");  // 40 blocks: 10 a stage
  cfg.batch.global_batch = 32;                  // the layout's 2 x 16 micro-batches of 1
  PlanLayout l = dp2_pp4_micro_batches_16();
  Cluster cluster = h100(1, 8);
  const LayoutPlan none = evaluate_layout(cfg, cluster, l);
  l.activation_checkpointing = true;
  const LayoutPlan all = evaluate_layout(cfg, cluster, l);
  ASSERT_LT(all.memory.device, none.memory.device);
  // A device between the two: every block recomputed fits, none does not.
  cluster.device.memory_bytes = (all.memory.device + none.memory.device) / 2;
  PlanOptions options;
  options.tp = 1;
  options.pp = 4;
  options.zero = 0;
  options.max_micro_batch = 1;
  options.allow_offload = false;
  const Plan plan = plan_layouts(cfg, cluster, options);
  const auto partial = std::find_if(plan.ranked.begin(), plan.ranked.end(), [](const LayoutPlan& p) {
    return p.layout.dp == 2 && p.layout.schedule == "1f1b" && p.layout.virtual_stages == 1 &&
           p.layout.recompute_blocks > 0;
  });
  ASSERT_NE(partial, plan.ranked.end());
  const int64_t n = partial->layout.recompute_blocks;
  ASSERT_TRUE(partial->layout.activation_checkpointing);
  ASSERT_LT(n, 10) << partial->layout.describe();
  EXPECT_EQ(partial->layout.describe(), fmt::format("dp2 tp1 pp4 zero0 mb1x16 1f1b ckpt{}", n));
  // The fewest that fit: one block fewer does not.
  PlanLayout fewer = partial->layout;
  fewer.recompute_blocks = n - 1;
  if (n == 1) fewer.activation_checkpointing = false;
  EXPECT_GT(evaluate_layout(cfg, cluster, fewer).memory.device, cluster.device.memory_bytes);
  EXPECT_LE(partial->memory.device, cluster.device.memory_bytes);
  // n of every stage's 10 blocks recomputed: n / 10 of the recomputation, so faster.
  EXPECT_NEAR(partial->time.recompute, all.time.recompute * static_cast<double>(n) / 10.0, 1e-9 * all.time.recompute);
  EXPECT_LT(partial->time.step, all.time.step);
  // Every block recomputed stays in the ranking beside it, slower.
  EXPECT_TRUE(std::any_of(plan.ranked.begin(), plan.ranked.end(), [&](const LayoutPlan& p) {
    return p.layout.describe() == "dp2 tp1 pp4 zero0 mb1x16 1f1b ckpt" && p.time.step > partial->time.step;
  }));
  // What the plan hands a run.
  RunConfig run = cfg;
  partial->layout.apply_to(run);
  EXPECT_EQ(run.model.recompute_blocks, n);
}

TEST(Plan, EachChunkReducesUnderTheLaterChunksBackwardAndTiedEmbeddingsAfterIt) {
  // dp8 over four nodes of four: the data-parallel ring crosses nodes, and with two
  // micro-batches a replica the reduction outlasts one micro-batch's backward.
  RunConfig cfg = recipe("llama/llama-2-13b");
  cfg.batch.global_batch = 32;
  PlanLayout l;
  l.dp = 8;
  l.pp = 2;
  l.zero = 1;
  l.micro_batch = 2;
  l.micro_batches = 2;
  std::vector<LayoutPlan> by_chunks;
  for (const int64_t chunks : {1, 2, 4}) {
    l.virtual_stages = chunks;
    by_chunks.push_back(evaluate_layout(cfg, h100(4, 4), l));
  }
  // The same bytes; chunk c's reduction starts c·pp passes before backward ends, so more
  // chunks hide more of it.
  const auto& plain = by_chunks[0].time;
  EXPECT_GT(plain.dp_comm, plain.dp_comm_total / 2) << "the reduction should outlast the last backward here";
  for (size_t i = 1; i < by_chunks.size(); ++i) {
    const auto& t = by_chunks[i].time;
    EXPECT_DOUBLE_EQ(t.dp_comm_total, plain.dp_comm_total);
    EXPECT_LT(t.dp_comm, by_chunks[i - 1].time.dp_comm) << by_chunks[i].layout.describe();
  }
  // BLOOM's embeddings, tied across the first and last stage, reduce after backward (the
  // two stages sum them first); the blocks' reductions still hide under it.
  RunConfig bloom = recipe("bloom/bloom-7b1");
  bloom.batch.global_batch = 32;
  l.virtual_stages = 1;
  l.zero = 0;
  const TimeEstimate tied = evaluate_layout(bloom, h100(4, 4), l).time;
  EXPECT_GT(tied.dp_comm, 0.0);
  EXPECT_LT(tied.dp_comm, tied.dp_comm_total);
}

TEST(Plan, RanksLayoutsAndRefusesWhatCannotRun) {
  const RunConfig cfg = recipe("llama/llama-2-70b");
  const Plan plan = plan_layouts(cfg, h100(4, 8));
  ASSERT_FALSE(plan.ranked.empty());
  for (size_t i = 0; i < plan.ranked.size(); ++i) {
    const auto& p = plan.ranked[i];
    EXPECT_TRUE(p.fits);
    EXPECT_LE(p.memory.device, plan.cluster.device.memory_bytes) << p.layout.describe();
    EXPECT_EQ(p.layout.dp * p.layout.tp * p.layout.pp, 32);
    EXPECT_EQ(p.layout.dp * p.layout.micro_batch * p.layout.micro_batches, cfg.batch.global_batch);
    EXPECT_GE(p.largest_micro_batch, p.layout.micro_batch);
    if (i > 0) {
      EXPECT_GE(p.time.step, plan.ranked[i - 1].time.step);
    }
    EXPECT_GT(p.time.mfu, 0.0);
    EXPECT_LT(p.time.mfu, 1.0);
  }
  // 70B parameters with fp32 masters and Adam: no replicated layout fits an 80 GB device.
  const auto replicated = std::find_if(plan.rejected.begin(), plan.rejected.end(),
                                       [](const LayoutPlan& p) { return p.layout.dp == 32 && p.layout.zero == 0; });
  ASSERT_NE(replicated, plan.rejected.end());
  EXPECT_NE(replicated->reason.find("does not fit"), std::string::npos) << replicated->reason;
  ASSERT_TRUE(plan.recipe_layout.has_value());
  EXPECT_EQ(plan.recipe_layout->layout.tp, 8);

  // Three devices: tp = 3 does not divide 32 heads, and says so.
  const Plan three = plan_layouts(recipe("llama/llama-2-7b"), h100(1, 3));
  const auto tp3 =
      std::find_if(three.rejected.begin(), three.rejected.end(), [](const LayoutPlan& p) { return p.layout.tp == 3; });
  ASSERT_NE(tp3, three.rejected.end());
  EXPECT_NE(tp3->reason.find("model.n_heads = 32"), std::string::npos) << tp3->reason;
}

TEST(Plan, TheRecipesOwnLayoutSaysTheLargestMicroBatchThatFits) {
  RunConfig cfg = recipe("llama/llama-tiny");
  cfg.batch.global_batch = 64;
  cfg.batch.micro_batch = 4;
  const Plan plan = plan_layouts(cfg, h100(1, 1));
  ASSERT_TRUE(plan.recipe_layout.has_value());
  const LayoutPlan& own = *plan.recipe_layout;
  ASSERT_TRUE(own.fits);
  // The same layout as the planner ranks it (it tries every micro-batch): the same limit.
  const auto same = std::find_if(plan.ranked.begin(), plan.ranked.end(), [&](const LayoutPlan& p) {
    return p.layout.zero == own.layout.zero && p.layout.offload == own.layout.offload &&
           p.layout.activation_checkpointing == own.layout.activation_checkpointing;
  });
  ASSERT_NE(same, plan.ranked.end());
  EXPECT_EQ(own.largest_micro_batch, same->largest_micro_batch);
  EXPECT_GE(own.largest_micro_batch, own.layout.micro_batch);
}

TEST(Plan, NothingFitsAndTheShortfallIsNamed) {
  const Plan plan = plan_layouts(recipe("llama/llama-2-70b"), fixed_host(2, 16));
  EXPECT_TRUE(plan.ranked.empty());
  ASSERT_FALSE(plan.rejected.empty());
  for (const auto& p : plan.rejected) {
    if (p.memory.device > 0) {
      EXPECT_NE(p.reason.find("of 16.0 GiB"), std::string::npos) << p.reason;
    }
  }
  EXPECT_NE(format_plan(plan).find("no layout fits"), std::string::npos);
}

TEST(Plan, AutoLayoutChoosesTheFastestThatFitsAndSaysWhy) {
  const RunConfig cfg = recipe("llama/llama-tiny");
  const LayoutChoice c = choose_layout(cfg, fixed_host(2, 16));
  EXPECT_TRUE(c.chosen.fits);
  ASSERT_TRUE(c.runner_up.has_value());
  EXPECT_LE(c.chosen.time.step, c.runner_up->time.step);
  EXPECT_NE(c.explanation.find("parallel.auto chose " + c.chosen.layout.describe()), std::string::npos)
      << c.explanation;
  EXPECT_NE(c.explanation.find("runner-up " + c.runner_up->layout.describe()), std::string::npos) << c.explanation;
  // The overrides give a recipe exactly the chosen layout.
  RunConfig chosen = cfg;
  c.chosen.layout.apply_to(chosen);
  const RunConfig overridden =
      Recipe::load_file(std::string(TIDE_SOURCE_DIR) + "/recipes/llama/llama-tiny.lua", c.overrides).config();
  EXPECT_FALSE(overridden.parallel.auto_layout);
  EXPECT_EQ(overridden.parallel.dp, chosen.parallel.dp);
  EXPECT_EQ(overridden.parallel.zero, chosen.parallel.zero);
  EXPECT_EQ(overridden.batch.micro_batch, chosen.batch.micro_batch);
  EXPECT_EQ(overridden.model.activation_checkpointing, chosen.model.activation_checkpointing);
  EXPECT_EQ(layout_of(overridden, 2).describe(), c.chosen.layout.describe());

  try {
    choose_layout(recipe("llama/llama-2-70b"), fixed_host(2, 16));
    FAIL() << "70B fitted 16 GiB";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "parallel.auto");
    EXPECT_NE(std::string(e.what()).find("no layout of 2 ranks fits: the closest"), std::string::npos) << e.what();
  }
}

// Expert parallelism: a rank holds E / ep experts, their state sharded over the dp / ep
// ranks holding the same ones; the tokens travel to their experts and back, four
// exchanges a block and micro-batch; the compute stays (routing is assumed even).
TEST(Plan, ExpertParallelismHoldsAShareOfTheExpertsAndSendsTheTokens) {
  const RunConfig cfg = recipe("mixtral/mixtral-8x7b");
  const Cluster cluster = h100(2, 8);
  PlanLayout l = one_sequence_micro_batches(16, 4);
  l.zero = 1;
  const LayoutPlan all = evaluate_layout(cfg, cluster, l);
  l.ep = 8;
  const LayoutPlan ep8 = evaluate_layout(cfg, cluster, l);
  const auto r = plan::rank_model(cfg.model, 1, PipelineStage{}, 8);
  // ZeRO-1 keeps whole fp32 parameters: the rest padded for 16 replicas, one expert a
  // block padded for its 2 holders.
  EXPECT_DOUBLE_EQ(ep8.memory.parameters,
                   4.0 * static_cast<double>(r.padded_elements(16) + r.expert_padded_elements(2)));
  EXPECT_LT(ep8.memory.parameters, all.memory.parameters / 3);
  // The moments: the rest's over 16 ranks, the experts' over their 2 holders.
  EXPECT_DOUBLE_EQ(ep8.memory.optimizer, 8.0 * (static_cast<double>(r.padded_elements(16)) / 16 +
                                                static_cast<double>(r.expert_padded_elements(2)) / 2));
  EXPECT_DOUBLE_EQ(ep8.time.compute, all.time.compute);
  EXPECT_EQ(all.time.ep_comm, 0.0);
  EXPECT_GT(ep8.time.ep_comm, 0.0);
  EXPECT_LT(ep8.time.dp_comm_total, all.time.dp_comm_total / 3) << "experts reduced over 2 ranks, not 16";
  // Recomputed blocks exchange their tokens again: 6 exchanges a block, not 4.
  l.activation_checkpointing = true;
  const LayoutPlan recomputing = evaluate_layout(cfg, cluster, l);
  const double latencies = 4.0 * 32 * cluster.device.collective_latency;  // the batch sizes, once a forward
  EXPECT_NEAR((recomputing.time.ep_comm - 2 * latencies) / (ep8.time.ep_comm - latencies), 1.5, 1e-9);
  EXPECT_LT(recomputing.memory.activations, ep8.memory.activations / 5);
  EXPECT_NE(ep8.layout.describe().find(" ep8"), std::string::npos) << ep8.layout.describe();
}

// The planner weighs every ep that divides dp and the experts, never context or
// sequence parallelism (not supported with experts); the recipe's own ep is evaluated.
TEST(Plan, AMixtureOfExpertsIsPlannedWithAndWithoutExpertParallelism) {
  const RunConfig cfg = recipe("mixtral/mixtral-8x7b");
  const Plan plan = plan_layouts(cfg, h100(4, 8));
  ASSERT_FALSE(plan.ranked.empty());
  bool spread = false;
  for (const auto& p : plan.ranked) {
    EXPECT_EQ(p.layout.cp, 1);
    EXPECT_FALSE(p.layout.sequence_parallel);
    EXPECT_EQ(p.layout.dp % p.layout.ep, 0) << p.layout.describe();
    EXPECT_EQ(cfg.model.moe_experts % p.layout.ep, 0) << p.layout.describe();
    spread = spread || p.layout.ep > 1;
    EXPECT_GT(p.time.mfu, 0.0);
    EXPECT_LT(p.time.mfu, 1.0);
  }
  EXPECT_TRUE(spread);
  ASSERT_TRUE(plan.recipe_layout.has_value());
  EXPECT_EQ(plan.recipe_layout->layout.ep, 8);
  EXPECT_GT(plan.recipe_layout->time.ep_comm, 0.0);
  PlanOptions two;
  two.cp = 2;
  const Plan cp2 = plan_layouts(cfg, h100(4, 8), two);
  EXPECT_TRUE(cp2.ranked.empty());
  ASSERT_FALSE(cp2.rejected.empty());
  EXPECT_NE(cp2.rejected.front().reason.find("not yet under context parallelism"), std::string::npos)
      << cp2.rejected.front().reason;

  // parallel.auto on two ranks gives a recipe the layout, ep included.
  const RunConfig tiny = recipe("mixtral/mixtral-tiny");
  PlanOptions spread_over_two;
  spread_over_two.ep = 2;
  const LayoutChoice c = choose_layout(tiny, fixed_host(2, 16), spread_over_two);
  EXPECT_EQ(c.chosen.layout.ep, 2);
  const RunConfig overridden =
      Recipe::load_file(std::string(TIDE_SOURCE_DIR) + "/recipes/mixtral/mixtral-tiny.lua", c.overrides).config();
  EXPECT_EQ(overridden.parallel.ep, 2);
  EXPECT_EQ(layout_of(overridden, 2).describe(), c.chosen.layout.describe());

  // An ep that cannot spread the experts is refused with the engine's reason, never
  // planned as nothing fitting.
  for (const auto& [model, ep, words] :
       {std::tuple{"mixtral/mixtral-tiny", 3, "parallel.ep: 3 does not divide model.moe_experts = 8"},
        std::tuple{"llama/llama-tiny", 2,
                   "parallel.ep: 2 spreads the experts of a mixture of experts, and the model "
                   "has none"}}) {
    PlanOptions asked;
    asked.ep = ep;
    const Plan refused = plan_layouts(recipe(model), fixed_host(2, 16), asked);
    EXPECT_TRUE(refused.ranked.empty()) << model;
    ASSERT_FALSE(refused.rejected.empty()) << model;
    EXPECT_NE(refused.rejected.front().reason.find(words), std::string::npos) << refused.rejected.front().reason;
  }
}

TEST(Plan, JsonCarriesTheItemisedFigures) {
  const Plan plan = plan_layouts(recipe("llama/llama-tiny"), fixed_host(2, 16));
  const nlohmann::json j = to_json(plan);
  EXPECT_EQ(j.at("schema"), "tide.plan/1");
  ASSERT_FALSE(j.at("ranked").empty());
  const auto& best = j.at("ranked").at(0);
  for (const char* key : {"parameters", "gradients", "optimizer", "activations", "loss", "device"})
    EXPECT_TRUE(best.at("memory").contains(key)) << key;
  for (const char* key : {"compute", "dp_comm", "bubble", "optimizer", "step", "tokens_per_second", "mfu"})
    EXPECT_TRUE(best.at("time").contains(key)) << key;
  EXPECT_EQ(j.at("cluster").at("devices_per_node"), 2);
}

TEST(Plan, MaterialisedAttentionKeepsItsProbabilitiesAndComputesEveryScore) {
  // BLOOM-560m's shape with learned positions: causal, so a fused kernel skips half.
  const RunConfig cfg = recipe("bloom/bloom-560m", {"model.positions=learned", "model.dropout=0.1"});
  Cluster fused = h100(1, 1);
  Cluster math = fused;
  math.device.fused_attention = false;
  PlanLayout l;
  l.micro_batch = 2;
  l.micro_batches = 256;
  const LayoutPlan a = evaluate_layout(cfg, fused, l), b = evaluate_layout(cfg, math, l);
  // Per block: the bf16 probabilities, their dropped copy and the one-byte mask, in place
  // of the fp32 log-sum-exp per row.
  const double B = 2, H = 16, T = 2048;
  const double scores = B * H * T * T * (2 + 2 + 1) - B * H * T * 4;
  ASSERT_EQ(a.memory.activations_by_block.size(), b.memory.activations_by_block.size());
  EXPECT_DOUBLE_EQ(b.memory.activations_by_block[0] - a.memory.activations_by_block[0], scores);
  // Attention's FLOPs: 12 T per width and token, half of them skipped by the fused kernel.
  const double skipped = 0.5 * 12 * 24 * 1024 * T * B * T * 256;
  EXPECT_NEAR((b.time.compute - a.time.compute) * fused.device.bf16_flops * fused.device.matmul_efficiency, skipped,
              1e-9 * skipped);
  EXPECT_GT(b.time.elementwise, a.time.elementwise);
}

// Attention's masks (transformer.cpp) are one tensor that every block of a kind shares:
// a window shorter than the sequence costs its parts' band for the run (Gemma 3's
// windowed layers; its full layers need none), ALiBi one [H, T, T] bias, and documents
// apart each micro-batch's own masks per kind of layer; all in bf16 here.
TEST(Plan, AttentionMasksAreOneTensorForEveryBlockOfAKind) {
  const auto activations = [](const std::string& name, const std::vector<std::string>& overrides, int64_t mb) {
    std::vector<std::string> all = overrides;
    all.emplace_back("precision.compute=bf16");
    PlanLayout l;
    l.micro_batch = mb;
    l.micro_batches = 8;
    return evaluate_layout(recipe(name, all), h100(1, 1), l).memory.activations;
  };
  // LLaMA 3 8B at 8192: causal, no mask; documents apart, a [B, 1, T, T] one.
  const double T8 = 8192;
  EXPECT_DOUBLE_EQ(
      activations("llama/llama-3-8b", {"data.document_attention=true"}, 2) - activations("llama/llama-3-8b", {}, 2),
      2 * T8 * T8 * 2);
  // Gemma 3 1B at 32768: its windowed layers attend in parts (attention_masks.h), their
  // band [R, R + w] once for the run, and each windowed block keeps the copies of the keys
  // and values its parts read (w / R times them beyond one) and the parts' outputs beside
  // the joined one; a window the sequence fits in needs no mask. Documents apart: the full
  // layers' [1, 1, T, T] and the windowed layers' parts of the sequence, [w, w] and the
  // blocks' [T - w, R + w], in place of the band.
  const double T32 = 32768;
  const ModelConfig gemma = recipe("gemma/gemma3-1b", {}).model;
  const double w = static_cast<double>(gemma.sliding_window),
               r = static_cast<double>(window_block_rows(gemma.sliding_window));
  const double hd = static_cast<double>(head_dim(gemma));
  double windowed_layers = 0;
  for (int64_t layer = 0; layer < gemma.n_layers; ++layer)
    windowed_layers += window_leaves_out_keys(gemma, layer, 32768);
  const double band = r * (r + w) * 2;
  const double kept =
      T32 * (2 * static_cast<double>(resolved_kv_heads(gemma)) * hd * w / r + static_cast<double>(gemma.n_heads) * hd) *
      2;
  const double windowed = activations("gemma/gemma3-1b", {}, 1);
  EXPECT_DOUBLE_EQ(windowed - activations("gemma/gemma3-1b", {"model.sliding_window=32768"}, 1),
                   band + windowed_layers * kept);
  EXPECT_DOUBLE_EQ(activations("gemma/gemma3-1b", {"data.document_attention=true"}, 1) - windowed,
                   T32 * T32 * 2 + (w * w + (T32 - w) * (r + w)) * 2 - band);
  // BLOOM 560M's ALiBi: [1, 16, T, T] for the run, [B, 16, T, T] a micro-batch with documents.
  const double T2 = 2048, H = 16;
  const double alibi = activations("bloom/bloom-560m", {}, 2);
  EXPECT_DOUBLE_EQ(alibi - activations("bloom/bloom-560m", {"model.positions=learned"}, 2), H * T2 * T2 * 2);
  EXPECT_DOUBLE_EQ(activations("bloom/bloom-560m", {"data.document_attention=true"}, 2) - alibi, 2 * H * T2 * T2 * 2);
}

TEST(Plan, Bf16ProductsRunAtTheirOwnMeasuredShareOfThePeak) {
  const RunConfig bf16 = recipe("llama/llama-tiny", {"precision.compute=bf16"});
  const RunConfig fp32 = recipe("llama/llama-tiny", {"precision.compute=fp32"});
  Cluster shared = h100(1, 1);
  Cluster own = shared;
  own.device.bf16_matmul_efficiency = shared.device.matmul_efficiency / 2;
  PlanLayout l;
  l.micro_batch = 8;
  const LayoutPlan a = evaluate_layout(bf16, shared, l), b = evaluate_layout(bf16, own, l);
  // Fused attention runs at the matmul rate on the table's GPUs: all of compute halves its rate.
  EXPECT_NEAR(b.time.compute, 2 * a.time.compute, 1e-12 * a.time.compute);
  EXPECT_DOUBLE_EQ(b.time.elementwise, a.time.elementwise);
  // fp32 products keep matmul_efficiency.
  EXPECT_DOUBLE_EQ(evaluate_layout(fp32, own, l).time.compute, evaluate_layout(fp32, shared, l).time.compute);
  // The field travels through a device's JSON, and a share outside [0, 1] is refused.
  nlohmann::json j = to_json(own.device);
  EXPECT_DOUBLE_EQ(device_from_json(j).bf16_matmul_efficiency, own.device.bf16_matmul_efficiency);
  j["bf16_matmul_efficiency"] = 1.5;
  EXPECT_THROW(device_from_json(j), std::invalid_argument);
}

TEST(Plan, PipelineStagesSharingCoresComputeFasterWhileTheOthersWait) {
  const RunConfig cfg = recipe("llama/llama-tiny");
  Cluster alike = h100(1, 2);
  Cluster shared = alike;
  shared.device.idle_peer_speedup = 1.5;
  PlanLayout l;
  l.pp = 2;
  l.micro_batch = 2;
  l.micro_batches = 4;
  const LayoutPlan a = evaluate_layout(cfg, alike, l), b = evaluate_layout(cfg, shared, l);
  // Two stages, M = 4: the other stage works (M - 1) of its micro-batches beside the
  // slowest one's M (its bubble share is one micro-batch of its time), and nothing beside
  // the fill and drain.
  const double M = 4,
               slowest = a.time.compute + a.time.recompute + a.time.elementwise + a.time.tp_comm + a.time.pp_comm;
  const double alongside = a.time.bubble * (M - 1);
  const double scale = (alongside + (slowest - alongside) / 1.5) / slowest;
  EXPECT_NEAR(b.time.compute, a.time.compute * scale, 1e-12 * a.time.compute);
  EXPECT_NEAR(b.time.elementwise, a.time.elementwise * scale, 1e-12 * a.time.elementwise);
  EXPECT_NEAR(b.time.bubble, a.time.bubble / 1.5, 1e-12 * a.time.bubble);
  EXPECT_DOUBLE_EQ(b.time.pp_comm, a.time.pp_comm);
  EXPECT_NEAR(b.time.step,
              b.time.compute + b.time.recompute + b.time.elementwise + b.time.tp_comm + b.time.pp_comm + b.time.bubble +
                  b.time.dp_comm + b.time.optimizer,
              1e-12 * b.time.step);
  // Without a pipeline no rank waits for another's stage: nothing changes.
  PlanLayout dp;
  dp.dp = 2;
  dp.micro_batch = 2;
  EXPECT_DOUBLE_EQ(evaluate_layout(cfg, shared, dp).time.step, evaluate_layout(cfg, alike, dp).time.step);
  nlohmann::json j = to_json(shared.device);
  EXPECT_DOUBLE_EQ(device_from_json(j).idle_peer_speedup, 1.5);
  j["idle_peer_speedup"] = 0.5;
  EXPECT_THROW(device_from_json(j), std::invalid_argument);
}

// A process pinned to some cores (taskset, a Slurm or container cpuset) plans, threads and
// offers slots for those, not for every core of the host.
TEST(Plan, LocalCoresAreTheAffinityMasks) {
  cpu_set_t all;
  CPU_ZERO(&all);
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(local_cores(), CPU_COUNT(&all));
  int first = 0;
  while (!CPU_ISSET(first, &all)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);  // this thread only
  const int pinned = local_cores();
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(pinned, 1);
}

TEST(Plan, DeviceFilesAreReadAndTheirFaultsNamed) {
  const std::string dir = ::testing::TempDir();
  const std::string good = dir + "/tide-plan-device.json", bad = dir + "/tide-plan-bad.json";
  nlohmann::json j = to_json(find_device("a100-80"));
  j["name"] = "a100-80-slow";
  j["matmul_efficiency"] = 0.4;
  j["fused_attention"] = false;
  std::ofstream(good) << j.dump();
  const DeviceSpec d = device_from_file(good);
  EXPECT_EQ(d.name, "a100-80-slow");
  EXPECT_DOUBLE_EQ(d.matmul_efficiency, 0.4);
  EXPECT_FALSE(d.fused_attention);
  EXPECT_DOUBLE_EQ(d.memory_bytes, find_device("a100-80").memory_bytes);
  auto error_of = [](const std::string& path) {
    try {
      device_from_file(path);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of(dir + "/no-such-device.json").find("cannot be read"), std::string::npos);
  std::ofstream(bad) << "{\"name\": \"x\",";
  EXPECT_NE(error_of(bad).find(bad), std::string::npos) << error_of(bad);
  j["bf16_flops"] = -1;
  std::ofstream(bad) << j.dump();
  const std::string e = error_of(bad);
  EXPECT_NE(e.find(bad), std::string::npos) << e;
  EXPECT_NE(e.find("not positive"), std::string::npos) << e;
}

// tide train's MFU peak on a calibrated CPU: the stored GEMM peak of ranks of its threads.
TEST(Plan, StoredMatmulPeakIsTheCalibrationsForThoseThreads) {
  const std::string path = ::testing::TempDir() + "/tide-calibration-peak.json";
  DeviceSpec one = nominal_cpu_device(1), two = nominal_cpu_device(1);
  one.fp32_flops = 90e9;
  one.bf16_flops = 2.5e9;
  two.fp32_flops = 150e9;
  std::ofstream(path) << nlohmann::json{{"schema", "tide.calibration/1"},
                                        {"cores", 2},
                                        {"by_threads", {{"1", to_json(one)}, {"2", to_json(two)}}}}
                             .dump();
  EXPECT_EQ(stored_matmul_peak(path, 1, false), 90e9);
  EXPECT_EQ(stored_matmul_peak(path, 1, true), 2.5e9);
  EXPECT_EQ(stored_matmul_peak(path, 2, false), 150e9);
  EXPECT_FALSE(stored_matmul_peak(path, 4, false));  // not calibrated for 4 threads
  EXPECT_FALSE(stored_matmul_peak(path + ".absent", 1, false));
  std::ofstream(path) << "{\"by_threads\": ";
  EXPECT_ANY_THROW(stored_matmul_peak(path, 1, false));
}

}  // namespace
}  // namespace tide
