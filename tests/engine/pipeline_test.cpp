#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/model/pipeline_stage.h"
#include "tide/engine/parallel/pipeline_schedule.h"
#include "tide/engine/run_layout.h"
#include "tiny_models.h"

namespace tide {
namespace {

TEST(PipelineSchedule, OneForwardOneBackwardBoundsActivationsAndKeepsOrder) {
  const int stages = 4;
  const int64_t m = 8;
  for (int s = 0; s < stages; ++s) {
    const auto ops = pipeline_schedule("1f1b", s, stages, m);
    ASSERT_EQ(ops.size(), static_cast<size_t>(2 * m));
    int64_t alive = 0, most = 0, next_forward = 0, next_backward = 0;
    for (const auto& op : ops) {
      EXPECT_EQ(op.chunk, 0);
      if (op.forward) {
        EXPECT_EQ(op.micro_batch, next_forward++);  // forwards in order
        most = std::max(most, ++alive);
      } else {
        EXPECT_EQ(op.micro_batch, next_backward++);  // backwards in order, each after its forward
        EXPECT_LT(op.micro_batch, next_forward);
        --alive;
      }
    }
    EXPECT_EQ(most, std::min<int64_t>(stages - s, m)) << "stage " << s;
  }
  // GPipe: every forward first.
  const auto gpipe = pipeline_schedule("gpipe", 1, stages, m);
  EXPECT_TRUE(std::all_of(gpipe.begin(), gpipe.begin() + m, [](const PipelineOp& op) { return op.forward; }));
  EXPECT_THROW(pipeline_schedule("zigzag", 0, 2, 2), std::invalid_argument);
  // Interleaving is 1F1B's, over micro-batches that come in groups of the stages.
  EXPECT_THROW(pipeline_schedule("gpipe", 0, 2, 4, 2), std::invalid_argument);
  EXPECT_THROW(pipeline_schedule("1f1b", 0, 2, 3, 2), std::invalid_argument);
}

// Runs every stage's schedule as the engine does: sends never wait, a receive waits for
// its message, one op at a time per stage. A chunk's forward takes 1/V and its backward
// 2/V (the whole stage: 1 and 2). Returns when the last op ends, or -1 when the stages
// deadlock.
double simulated_step(int stages, int64_t micro_batches, int chunks) {
  std::vector<std::vector<PipelineOp>> plan;
  for (int s = 0; s < stages; ++s) plan.push_back(pipeline_schedule("1f1b", s, stages, micro_batches, chunks));
  const int64_t virtual_stages = static_cast<int64_t>(stages) * chunks;
  // done[forward][virtual stage][micro-batch]: when that op ended, or -1.
  std::vector<std::vector<std::vector<double>>> done(
      2, std::vector<std::vector<double>>(static_cast<size_t>(virtual_stages),
                                          std::vector<double>(static_cast<size_t>(micro_batches), -1.0)));
  const auto at = [&](bool forward, int64_t vs, int64_t m) -> double& {
    return done[forward ? 1 : 0][static_cast<size_t>(vs)][static_cast<size_t>(m)];
  };
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<double> clock(static_cast<size_t>(stages), 0.0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < stages; ++s) {
      auto& i = next[static_cast<size_t>(s)];
      while (i < plan[static_cast<size_t>(s)].size()) {
        const PipelineOp& op = plan[static_cast<size_t>(s)][i];
        const int64_t vs = static_cast<int64_t>(op.chunk) * stages + s, m = op.micro_batch;
        double ready = clock[static_cast<size_t>(s)];
        if (op.forward && vs > 0) {
          if (at(true, vs - 1, m) < 0) break;  // waits for the activations
          ready = std::max(ready, at(true, vs - 1, m));
        }
        if (!op.forward) {
          EXPECT_GE(at(true, vs, m), 0.0) << "a backward before its forward";
          if (vs + 1 < virtual_stages) {
            if (at(false, vs + 1, m) < 0) break;  // waits for the gradients
            ready = std::max(ready, at(false, vs + 1, m));
          }
        }
        EXPECT_LT(at(op.forward, vs, m), 0.0) << "an op run twice";
        clock[static_cast<size_t>(s)] = ready + (op.forward ? 1.0 : 2.0) / chunks;
        at(op.forward, vs, m) = clock[static_cast<size_t>(s)];
        ++i;
        moved = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s)
    if (next[static_cast<size_t>(s)] != plan[static_cast<size_t>(s)].size()) return -1.0;
  return *std::max_element(clock.begin(), clock.end());
}

TEST(PipelineSchedule, InterleavingRunsEveryChunkWithoutDeadlockAndShrinksTheBubbleByTheChunks) {
  for (const int stages : {2, 3, 4}) {
    for (const int chunks : {1, 2, 3, 4}) {
      for (const int64_t groups : {1, 2, 3}) {
        const int64_t m = groups * stages;
        const std::string where = fmt::format("pp {} chunks {} micro-batches {}", stages, chunks, m);
        for (int s = 0; s < stages; ++s) {
          // Each chunk's forward and backward of each micro-batch once; a stage holds at
          // most its warm-up's chunk-forwards plus one (all of them when they are fewer).
          const auto ops = pipeline_schedule("1f1b", s, stages, m, chunks);
          ASSERT_EQ(ops.size(), static_cast<size_t>(2 * m * chunks)) << where;
          int64_t alive = 0, most = 0;
          for (const auto& op : ops) {
            EXPECT_EQ(std::count(ops.begin(), ops.end(), op), 1) << where;
            most = std::max(most, alive += op.forward ? 1 : -1);
          }
          const int64_t warmup = chunks == 1 ? stages - s - 1 : 2 * (stages - s - 1) + (chunks - 1) * stages;
          EXPECT_EQ(most, std::min<int64_t>(warmup + 1, m * chunks)) << where << " stage " << s;
        }
        // The ideal step is 3 M (no stage ever idle); the bubble is (pp - 1) / V of a
        // micro-batch's forward and backward, that is (pp - 1) / (V M) of the step. The
        // clock adds at most 6 M V terms of 1/V or 2/V: its rounding is far below 1e-9.
        const double step = simulated_step(stages, m, chunks);
        ASSERT_GE(step, 0.0) << where << ": the stages deadlock";
        const double ideal = 3.0 * static_cast<double>(m);
        EXPECT_NEAR((step - ideal) / ideal, (stages - 1.0) / (chunks * static_cast<double>(m)), 1e-9) << where;
      }
    }
  }
}

TEST(PartitionStages, BalancesCostAndHonoursAGivenCut) {
  ModelConfig m = testing::tiny_llama();
  m.n_layers = 8;
  auto stages = partition_stages(m, 2, 64);
  ASSERT_EQ(stages.size(), 2u);
  ASSERT_EQ(stages[0].chunks.size(), 1u);
  EXPECT_EQ(stages[0].chunks[0].first, 0);
  EXPECT_EQ(stages[0].chunks[0].end, stages[1].chunks[0].first);
  EXPECT_EQ(stages[1].chunks[0].end, 8);
  EXPECT_TRUE(stages[0].first && !stages[0].last && stages[1].last && !stages[1].first);
  // A large vocabulary makes the output head expensive: the last stage gets fewer blocks.
  ModelConfig big_head = m;
  big_head.vocab_size = 200000;
  const auto skewed = partition_stages(big_head, 2, 64);
  EXPECT_GT(stage_blocks(skewed[0], 8), stage_blocks(skewed[1], 8));
  const auto given = partition_stages(m, 3, 64, {2, 5, 1});
  EXPECT_EQ(given[1].chunks[0].first, 2);
  EXPECT_EQ(given[1].chunks[0].end, 7);
  EXPECT_THROW(partition_stages(m, 3, 64, {2, 2, 2}), ConfigError);
  EXPECT_THROW(partition_stages(m, 9, 64), ConfigError);
  // Layers of two kinds, cut by what their kernels compute: at a sequence of 4096 a
  // windowed layer (window 64) attends in parts of about R + w = 96 keys a query, where a
  // layer in full is causal and computes 2048 (4096 with documents apart, a mask). So the
  // stage holding the three full layers gets fewer blocks, wherever they are, with
  // documents and soft-capped (the capped op reads w + R / 2 = 80) too.
  ModelConfig mixed = m;
  mixed.sliding_window = 64;
  mixed.full_attention_layers = {0, 1, 2};
  const auto by_keys = partition_stages(mixed, 2, 4096);
  EXPECT_LT(stage_blocks(by_keys[0], 8), stage_blocks(by_keys[1], 8));
  const auto documents = partition_stages(mixed, 2, 4096, {}, 1, /*documents=*/true);
  EXPECT_LT(stage_blocks(documents[0], 8), stage_blocks(documents[1], 8));
  mixed.full_attention_layers = {5, 6, 7};
  const auto reversed = partition_stages(mixed, 2, 4096);
  EXPECT_GT(stage_blocks(reversed[0], 8), stage_blocks(reversed[1], 8));
  mixed.attention_softcap = 50;
  EXPECT_GT(stage_blocks(partition_stages(mixed, 2, 4096)[0], 8), 4);
  // A window the sequence fits in leaves nothing out: every layer alike.
  EXPECT_EQ(stage_blocks(partition_stages(mixed, 2, 64)[0], 8), 4);
}

TEST(PartitionStages, InterleavedRanksTakeEveryPpthChunkOfTheModel) {
  ModelConfig m = testing::tiny_llama();
  m.n_layers = 8;
  const auto stages = partition_stages(m, 2, 64, {}, 2);
  ASSERT_EQ(stages.size(), 2u);
  // Virtual stage c * pp + r is chunk c of rank r; the four cover the blocks in order.
  std::vector<BlockRange> in_order;
  for (int c = 0; c < 2; ++c)
    for (int r = 0; r < 2; ++r) in_order.push_back(stages[static_cast<size_t>(r)].chunks.at(static_cast<size_t>(c)));
  int64_t at = 0;
  for (const auto& range : in_order) {
    EXPECT_EQ(range.first, at);
    EXPECT_GT(range.end, range.first) << "every chunk holds a block";
    at = range.end;
  }
  EXPECT_EQ(at, 8);
  EXPECT_EQ(stage_blocks(stages[0], 8) + stage_blocks(stages[1], 8), 8);
  EXPECT_TRUE(stages[0].first && !stages[0].last && stages[1].last && !stages[1].first);
  // Ownership follows the chunks: rank 0 holds the first and third quarters.
  const std::string block = "model.layers." + std::to_string(in_order[2].first) + ".mlp.up_proj.weight";
  EXPECT_TRUE(stage_owns(stages[0], block));
  EXPECT_FALSE(stage_owns(stages[1], block));
  EXPECT_TRUE(stage_owns(stages[0], "model.embed_tokens.weight"));
  EXPECT_TRUE(stage_owns(stages[1], "lm_head.weight"));
  // Given counts are per virtual stage, in model order.
  const auto given = partition_stages(m, 2, 64, {1, 3, 3, 1}, 2);
  EXPECT_EQ(given[0].chunks[1].first, 4);
  EXPECT_EQ(given[0].chunks[1].end, 7);
  EXPECT_EQ(given[1].chunks[0].first, 1);
  // Each chunk's backward completes its flat units (block b is unit b + 1) from the last
  // block, with unit 0 (the embeddings) last where the chunk starts the model and the
  // head's unit first where it ends it: its own (9) untied, unit 0 tied.
  ParameterUnitLayout untied{8, false, false}, tied{8, true, false};
  EXPECT_EQ(chunk_units(given[0], 0, untied), (std::vector<int>{1, 0}));
  EXPECT_EQ(chunk_units(given[0], 1, untied), (std::vector<int>{7, 6, 5}));
  EXPECT_EQ(chunk_units(given[1], 0, untied), (std::vector<int>{4, 3, 2}));
  EXPECT_EQ(chunk_units(given[1], 1, untied), (std::vector<int>{9, 8}));
  EXPECT_EQ(chunk_units(given[1], 1, tied), (std::vector<int>{0, 8}));
  EXPECT_EQ(chunk_units(PipelineStage{}, 0, ParameterUnitLayout{3, false, false}), (std::vector<int>{4, 3, 2, 1, 0}));
  EXPECT_EQ(chunk_units(PipelineStage{}, 0, ParameterUnitLayout{3, true, true}), (std::vector<int>{3, 2, 1, 0}));
  // Names place parameters in those units.
  EXPECT_EQ(untied.unit_of("lm_head.weight"), 9);
  EXPECT_EQ(untied.unit_of("model.norm.weight"), 9);
  EXPECT_EQ(untied.unit_of("model.embed_tokens.weight"), 0);
  EXPECT_EQ(untied.unit_of("model.layers.7.mlp.up_proj.weight"), 8);
  EXPECT_EQ(tied.unit_of("transformer.ln_f.bias"), 0);
  EXPECT_EQ(untied.count(), 10);
  EXPECT_EQ(tied.count(), 9);
  // Activation checkpointing recomputes the first model.recompute_blocks of each chunk.
  ModelConfig ckpt = m;
  EXPECT_EQ(recomputed_blocks(ckpt, given[0].chunks[1]), 0);
  ckpt.activation_checkpointing = true;
  EXPECT_EQ(recomputed_blocks(ckpt, given[0].chunks[1]), 3);
  ckpt.recompute_blocks = 2;
  EXPECT_EQ(recomputed_blocks(ckpt, given[0].chunks[1]), 2);
  EXPECT_EQ(recomputed_blocks(ckpt, given[0].chunks[0]), 1) << "a chunk of one block";
  EXPECT_EQ(recomputed_blocks(ckpt, BlockRange{}), 2) << "the whole model";
  try {
    partition_stages(m, 2, 64, {4, 4}, 2);
    FAIL() << "two counts cut four virtual stages";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "parallel.pipeline_stages");
    EXPECT_NE(std::string(e.what()).find("2 x 2 = 4 stages"), std::string::npos) << e.what();
  }
  try {
    partition_stages(m, 4, 64, {}, 3);
    FAIL() << "12 virtual stages of 8 blocks";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "parallel.virtual_stages");
  }
}

TEST(PipelineLayout, InterleavingIsRefusedWhereItCannotRunNamingTheField) {
  RunConfig cfg;
  cfg.model = testing::tiny_llama();
  cfg.model.n_layers = 4;
  cfg.data.seq_len = 16;
  cfg.batch.global_batch = 4;
  cfg.batch.micro_batch = 1;
  cfg.parallel.virtual_stages = 2;
  const auto refused = [&](const RunConfig& c, int world, const std::string& field, const std::string& words) {
    try {
      check_supported_layout(c, world);
      ADD_FAILURE() << "accepted; expected a refusal of " << field;
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), field) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(cfg, 1, "parallel.virtual_stages", "pp > 1");
  cfg.parallel.pp = 2;
  EXPECT_NO_THROW(check_supported_layout(cfg, 2));  // 4 micro-batches through 2 x 2 chunks of one block
  RunConfig gpipe = cfg;
  gpipe.parallel.pipeline_schedule = "gpipe";
  refused(gpipe, 2, "parallel.pipeline_schedule", "does not interleave");
  RunConfig odd = cfg;
  odd.batch.global_batch = 3;
  refused(odd, 2, "parallel.virtual_stages", "groups of pp = 2, and a step has 3");
  RunConfig zero2 = cfg;  // each chunk's pass reduce-scatters its own units
  zero2.parallel.zero = 2;
  zero2.batch.global_batch = 8;
  EXPECT_NO_THROW(check_supported_layout(zero2, 4));
  RunConfig deep = cfg;
  deep.parallel.virtual_stages = 3;
  refused(deep, 2, "parallel.virtual_stages", "each stage needs a block");
}

}  // namespace
}  // namespace tide
