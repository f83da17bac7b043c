#include <nlohmann/json.hpp>
#include <gtest/gtest.h>

#include "tide/engine/config_schema.h"
#include "tide/engine/model/parameter_names.h"
#include "tide/engine/train/flops.h"
#include "tiny_models.h"

namespace tide {
namespace {
using json = nlohmann::json;

TEST(ConfigSchema, DefaultsRoundTrip) {
  const RunConfig c;
  EXPECT_EQ(config_to_json(config_from_json(config_to_json(c))), config_to_json(c));
}

TEST(ConfigSchema, EveryFieldIsDocumentedOnce) {
  std::set<std::string> seen;
  for (const auto& f : config_schema()) {
    EXPECT_TRUE(seen.insert(f.path).second) << f.path;
    EXPECT_FALSE(f.doc.empty()) << f.path;
  }
  EXPECT_NE(schema_markdown().find("`optimizer.lr`"), std::string::npos);
}

TEST(ConfigSchema, RangeErrorsNameFieldAndValue) {
  try {
    config_from_json(json{{"optimizer", {{"lr", -1}}}});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "optimizer.lr");
    EXPECT_NE(std::string(e.what()).find("-1"), std::string::npos) << e.what();
  }
}

TEST(ConfigSchema, ChoicesAreListed) {
  try {
    config_from_json(json{{"model", {{"norm", "batchnorm"}}}});
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rmsnorm, layernorm"), std::string::npos) << e.what();
  }
}

TEST(ConfigSchema, CrossFieldChecks) {
  EXPECT_THROW(config_from_json(json{{"batch", {{"micro_batch", 3}, {"global_batch", 8}}}}), ConfigError);
  EXPECT_THROW(config_from_json(json{{"model", {{"dim", 64}, {"n_heads", 4}, {"n_kv_heads", 3}}}}), ConfigError);
  EXPECT_THROW(config_from_json(json{{"model", {{"family", "bloom"}, {"n_kv_heads", 8}}}}), ConfigError);
  EXPECT_THROW(config_from_json(json{{"data", {{"seq_len", 4096}}}, {"model", {{"max_seq_len", 2048}}}}),
               ConfigError);
  EXPECT_THROW(config_from_json(json{{"schedule", {{"steps", 10}, {"warmup_steps", 20}}}}), ConfigError);
  try {
    config_from_json(json{{"model", {{"recompute_blocks", 2}}}});
    ADD_FAILURE() << "blocks to recompute without activation checkpointing";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "model.recompute_blocks");
    EXPECT_NE(std::string(e.what()).find("model.activation_checkpointing = true"), std::string::npos) << e.what();
  }
  EXPECT_EQ(config_from_json(json{{"model", {{"activation_checkpointing", true}, {"recompute_blocks", 2}}}})
                .model.recompute_blocks,
            2);
  // A shared expert stands beside routed ones, and its gate gates one.
  for (const auto& [model, field] :
       {std::pair{json{{"moe_shared_ffn_dim", 64}}, "model.moe_shared_ffn_dim"},
        std::pair{json{{"moe_experts", 4}, {"moe_shared_gate", true}}, "model.moe_shared_gate"}}) {
    try {
      config_from_json(json{{"model", model}});
      ADD_FAILURE() << model.dump();
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), field) << e.what();
    }
  }
}

TEST(ConfigSchema, LayersAttendingInFullAreLayersOfTheModelUnderAWindow) {
  const auto error = [](const json& model) {
    try {
      config_from_json(json{{"model", model}});
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto windowed = [](const json& extra) {
    json m = {{"n_layers", 6}, {"sliding_window", 16}};
    m.update(extra);
    return m;
  };
  const RunConfig ok =
      config_from_json(json{{"model", windowed({{"full_attention_layers", {5, 2}}, {"rope_local_theta", 1e4}})}});
  EXPECT_EQ(ok.model.full_attention_layers, (std::vector<int64_t>{5, 2}));
  EXPECT_FALSE(attends_over_window(ok.model, 2));
  EXPECT_TRUE(attends_over_window(ok.model, 3));
  EXPECT_EQ(windowed_rope(ok.model).rope_theta, 1e4);
  EXPECT_EQ(error({{"full_attention_layers", {1}}}),
            "model.full_attention_layers: [1] attend in full despite a sliding window, and model.sliding_window is 0");
  EXPECT_EQ(error(windowed({{"full_attention_layers", {6}}})),
            "model.full_attention_layers[1]: 6 is not a layer of model.n_layers = 6 (layers count from 0)");
  EXPECT_EQ(error(windowed({{"full_attention_layers", {1, 3, 1}}})),
            "model.full_attention_layers[3]: 1 is model.full_attention_layers[1] too");
  EXPECT_EQ(error(windowed({{"full_attention_layers", {-1}}})),
            "model.full_attention_layers[1]: -1 is out of range [0, 1000000]");
  EXPECT_EQ(error({{"rope_local_theta", 1e4}}),
            "model.rope_local_theta: 10000 is the RoPE base of the layers attending over model.sliding_window, and "
            "model.sliding_window is 0");
  EXPECT_EQ(error(windowed({{"positions", "learned"}, {"rope_local_theta", 1e4}})),
            "model.rope_local_theta: 10000 is the RoPE base of the layers attending over model.sliding_window, and "
            "model.positions is not rope");
}

TEST(ConfigSchema, ADataBlendNamesEachDatasetAndRefusesWhatCannotBeOne) {
  const RunConfig c = config_from_json(
      json{{"data", {{"blend", {{{"path", "data/web/"}, {"weight", 3}}, {{"path", "data/code"}, {"name", "py"}}}}}}});
  const auto sources = data_sources(c.data);
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[0].name, "web");  // the directory's name, its trailing '/' aside
  EXPECT_EQ(sources[0].weight, 3);
  EXPECT_EQ(sources[1].name, "py");
  EXPECT_EQ(sources[1].weight, 1);  // the default
  EXPECT_EQ(config_to_json(config_from_json(config_to_json(c))), config_to_json(c));
  // data.path alone is a blend of one.
  RunConfig single;
  single.data.path = "data/kjv";
  ASSERT_EQ(data_sources(single.data).size(), 1u);
  EXPECT_EQ(data_sources(single.data)[0].name, "kjv");

  const auto refused = [](const json& data, const std::string& field, const std::string& words) {
    try {
      config_from_json(json{{"data", data}});
      ADD_FAILURE() << data.dump() << " was taken";
    } catch (const ConfigError& e) {
      EXPECT_EQ(e.field(), field) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused({{"path", "a"}, {"blend", {{{"path", "b"}}}}}, "data.blend", "set one");
  refused({{"blend", {{{"path", "a/x"}}, {{"path", "b/x"}}}}}, "data.blend[2].name", "data.blend[1]'s name too");
  refused({{"blend", {{{"path", "a"}, {"weight", 0}}}}}, "data.blend[1].weight", "not above 0");
  refused({{"blend", {{{"path", "a"}, {"weight", -2}}}}}, "data.blend[1].weight", "out of range");
  refused({{"blend", {{{"path", "a"}, {"share", 2}}}}}, "data.blend[1]", "unknown key \"share\"");
  refused({{"blend", {{{"weight", 2}}}}}, "data.blend[1].path", "missing");
  refused({{"blend", {{{"path", "a"}, {"name", "../up"}}}}}, "data.blend[1].name", "may hold only");
  refused({{"blend", {{{"path", "."}}}}}, "data.blend[1].name", "give a name");
  refused({{"blend", "data/a"}}, "data.blend", "expected a list");
}

TEST(ConfigSchema, WholeFloatsAreIntegers) {
  const RunConfig c = config_from_json(json{{"schedule", {{"steps", 1e3}}}});
  EXPECT_EQ(c.schedule.steps, 1000);
  EXPECT_THROW(config_from_json(json{{"schedule", {{"steps", 1.5}}}}), ConfigError);
}

TEST(ConfigSchema, OverrideParsesJsonOrString) {
  json j = json::object();
  apply_override(j, "optimizer.lr=0.5");
  apply_override(j, "name=hello world");
  apply_override(j, "model.tie_embeddings=true");
  EXPECT_EQ(j["optimizer"]["lr"], 0.5);
  EXPECT_EQ(j["name"], "hello world");
  EXPECT_EQ(j["model"]["tie_embeddings"], true);
  EXPECT_THROW(apply_override(j, "optimizer=1"), ConfigError);
}

TEST(ModelShape, ParameterCountFormula) {
  ModelConfig m;  // LLaMA-2 7B defaults
  EXPECT_EQ(parameter_count(m), 6'738'415'616);
  m.n_kv_heads = 8;
  EXPECT_LT(parameter_count(m), 6'738'415'616);
  EXPECT_EQ(resolved_kv_heads(m), 8);
}

// Model FLOPs: 6 per matmul weight and 12 per attention width and counted key. A window
// the sequence fits in counts every key; one of w keys counts T times the keys it leaves
// causal attention, (w (w + 1) / 2 + (T - w) w) / (T (T + 1) / 2): T = 8, w = 2 gives
// 8 * 15 / 36; a layer in full among windowed ones counts T.
// The model the FLOPs tests count: 3 layers of width 16, 2 heads, vocabulary 100.
ModelConfig flops_model() {
  ModelConfig m;
  m.vocab_size = 100;
  m.dim = 16;
  m.n_layers = 3;
  m.n_heads = 2;
  m.multiple_of = 16;
  return m;
}

TEST(ModelShape, AttentionFlopsCountTheKeysEachLayerSees) {
  ModelConfig m = flops_model();
  const double width = 16;
  const double full = train_flops_per_token(m, 8);
  m.sliding_window = 8;
  EXPECT_EQ(train_flops_per_token(m, 8), full);
  EXPECT_EQ(counted_keys(m, 0, 8), 8.0);
  m.sliding_window = 2;
  EXPECT_DOUBLE_EQ(counted_keys(m, 1, 8), 8.0 * 15 / 36);
  m.full_attention_layers = {1};
  EXPECT_EQ(counted_keys(m, 1, 8), 8.0);
  EXPECT_DOUBLE_EQ(full - train_flops_per_token(m, 8), 12 * width * 2 * (8 - 8.0 * 15 / 36));
}

// LoRA: a frozen matmul weight is multiplied forward and by its output's gradient (4
// FLOPs), its own gradient not made; the adapters count 6 a weight as any trained one.
TEST(ModelShape, LoraFlopsLeaveOutTheFrozenWeightsGradients) {
  ModelConfig m = flops_model();
  const double full = train_flops_per_token(m, 8);
  // What the count takes for matmul weights: all but the lookup table (the norms' few too).
  const double matmul = static_cast<double>(parameter_count(m) - m.vocab_size * m.dim);
  m.lora_rank = 2;
  m.lora_targets = {"q_proj", "v_proj"};
  const double adapters = 3 * 2 * (2 * (16 + 16));  // rank 2 on two 16 x 16 projections a layer
  ASSERT_EQ(lora_parameter_count(m), adapters);
  EXPECT_DOUBLE_EQ(train_flops_per_token(m, 8), full - 2 * matmul + 6 * adapters);
}

// Each parameter's module, and how the module splits over tensor-parallel ranks: the
// projections that write the residual by their inputs, the others by their outputs, the
// key / value ones whole where their heads do not split, everything else whole.
TEST(ModelShape, EachBlockModuleSplitsAsMegatronsLayoutsDo) {
  EXPECT_EQ(block_module_of("model.layers.3.self_attn.q_proj.lora_A.weight"), "q_proj");
  EXPECT_EQ(block_module_of("model.layers.0.mlp.down_proj.weight"), "down_proj");
  EXPECT_EQ(block_module_of("transformer.h.1.self_attention.dense.bias"), "dense");
  EXPECT_EQ(block_module_of("model.layers.12.input_layernorm.weight"), "input_layernorm");
  EXPECT_EQ(block_module_of("model.norm.weight"), "");
  EXPECT_EQ(block_module_of("lm_head.weight"), "");

  const ModelConfig llama = testing::tiny_llama();  // 2 kv heads
  EXPECT_EQ(projection_split(llama, "q_proj", 2), ProjectionSplit::Column);
  EXPECT_EQ(projection_split(llama, "k_proj", 2), ProjectionSplit::Column);
  EXPECT_EQ(projection_split(llama, "v_proj", 4), ProjectionSplit::Whole);
  EXPECT_EQ(projection_split(llama, "o_proj", 4), ProjectionSplit::Row);
  EXPECT_EQ(projection_split(llama, "gate_proj", 2), ProjectionSplit::Column);
  EXPECT_EQ(projection_split(llama, "down_proj", 1), ProjectionSplit::Row);
  EXPECT_EQ(projection_split(llama, "input_layernorm", 2), ProjectionSplit::Whole);
  EXPECT_EQ(projection_split(llama, "dense", 2), ProjectionSplit::Whole);  // not LLaMA's
  const ModelConfig bloom = testing::tiny_bloom();
  EXPECT_EQ(projection_split(bloom, "query_key_value", 2), ProjectionSplit::Column);
  EXPECT_EQ(projection_split(bloom, "dense", 2), ProjectionSplit::Row);
  EXPECT_EQ(projection_split(bloom, "dense_h_to_4h", 2), ProjectionSplit::Column);
  EXPECT_EQ(projection_split(bloom, "dense_4h_to_h", 2), ProjectionSplit::Row);
}

// What the kernels compute (the planner's time, pipeline cuts): a causal layer without a
// mask half the keys, one with a mask (a window shorter than the sequence, documents
// apart, ALiBi) all of them, whatever the window leaves out; without a fused kernel all;
// soft-capped attention half, mask or not.
TEST(ModelShape, AttentionComputesHalfTheKeysCausallyAllOfThemUnderAMaskAndAWindowsBlocks) {
  ModelConfig m;
  m.n_layers = 3;
  m.sliding_window = 2;
  m.full_attention_layers = {1};
  EXPECT_EQ(computed_keys(m, 1, 8, false), 4.0);
  // The window of 2 in parts (attention_masks.h): the first 2 queries a causal square (1
  // key each, half of 2), then 6 blocks of R = 1 query reading R + w = 3 keys: 20 / 8.
  EXPECT_EQ(window_block_rows(2), 1);
  EXPECT_EQ(computed_keys(m, 0, 8, false), 2.5);
  EXPECT_EQ(computed_keys(m, 1, 8, true), 8.0);
  // Gemma 3's 512 at 4096: 512 queries of 256 keys, 14 blocks of 256 of 768; with
  // documents apart the first square's 512 each; soft-capped, a block's queries read
  // about w + R / 2 = 640.
  ModelConfig gemma = m;
  gemma.sliding_window = 512;
  EXPECT_EQ(window_block_rows(512), 256);
  EXPECT_EQ(computed_keys(gemma, 0, 4096, false), (512.0 * 256 + 14 * 256 * 768) / 4096);
  EXPECT_EQ(computed_keys(gemma, 0, 4096, true), (512.0 * 512 + 14 * 256 * 768) / 4096);
  gemma.attention_softcap = 50;
  EXPECT_EQ(computed_keys(gemma, 0, 4096, true), (512.0 * 256 + 14 * 256 * 640) / 4096);
  EXPECT_EQ(computed_keys(m, 1, 8, false, /*fused=*/false), 8.0);
  m.sliding_window = 8;  // the sequence fits: no mask
  EXPECT_EQ(computed_keys(m, 0, 8, false), 4.0);
  m.positions = PositionKind::ALiBi;
  EXPECT_EQ(computed_keys(m, 1, 8, false), 8.0);
  m.attention_softcap = 50;
  EXPECT_EQ(computed_keys(m, 1, 8, true, false), 4.0);
}

TEST(ModelShape, HeadsOfTheirOwnWidth) {
  // Mistral NeMo 12B: 32 heads of 128 at dim 5120, so the query and output projections
  // are 4096 wide (12,247,782,400 parameters, its published count).
  ModelConfig m;
  m.vocab_size = 131072;
  m.dim = 5120;
  m.n_layers = 40;
  m.n_heads = 32;
  m.n_kv_heads = 8;
  m.head_dim = 128;
  m.ffn_dim = 14336;
  EXPECT_EQ(head_dim(m), 128);
  EXPECT_EQ(parameter_count(m), 12'247'782'400);
  // n_heads need not divide dim then; for BLOOM's fused layout it must, and the width too.
  EXPECT_EQ(config_from_json(json{{"model", {{"dim", 64}, {"n_heads", 6}, {"head_dim", 16}}}}).model.head_dim, 16);
  try {
    config_from_json(json{{"model", {{"dim", 64}, {"n_heads", 6}}}});
    ADD_FAILURE() << "6 heads do not divide 64";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "model.n_heads: 6 does not divide model.dim = 64 (or set model.head_dim)");
  }
  try {
    config_from_json(json{{"model", {{"family", "bloom"}, {"dim", 64}, {"n_heads", 4}, {"head_dim", 32}}}});
    ADD_FAILURE() << "BLOOM's fused QKV layout has heads of dim / n_heads";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.field(), "model.head_dim");
  }
}

}  // namespace
}  // namespace tide
