#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tide/engine/config_schema.h"
#include "tide/scripting/recipe.h"

namespace tide {
namespace {
namespace fs = std::filesystem;

std::string recipe_path(const std::string& rel) { return std::string(TIDE_SOURCE_DIR) + "/recipes/" + rel; }

std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    Recipe::load_string(text, "@r.lua", overrides);
  } catch (const RecipeError& e) {
    return e.what();
  }
  return "";
}

TEST(Recipes, EveryBundledRecipeValidates) {
  int n = 0;
  for (const auto& e : fs::recursive_directory_iterator(std::string(TIDE_SOURCE_DIR) + "/recipes")) {
    if (e.path().extension() != ".lua") continue;
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(Recipe::load_file(e.path().string()));
    ++n;
  }
  EXPECT_GE(n, 10);
}

TEST(Recipes, PublishedParameterCountsAreExact) {
  const std::pair<const char*, int64_t> expected[] = {
      {"llama/llama-2-7b.lua", 6'738'415'616},
      {"llama/llama-2-13b.lua", 13'015'864'320},
      {"llama/llama-2-70b.lua", 68'976'648'192},
      {"llama/llama-3-8b.lua", 8'030'261'248},
      {"llama/llama-3-70b.lua", 70'553'706'496},
      {"llama/llama-3.1-8b.lua", 8'030'261'248},
      {"mistral/mistral-7b-v0.1.lua", 7'241'732'096},
      {"qwen/qwen2.5-7b.lua", 7'615'616'512},
      {"mistral/mistral-nemo-12b.lua", 12'247'782'400},
      {"qwen/qwen3-8b.lua", 8'190'735'360},
      {"gemma/gemma-2b.lua", 2'506'172'416},
      {"gemma/gemma-7b.lua", 8'537'680'896},
      {"gemma/gemma2-2b.lua", 2'614'341'888},
      {"gemma/gemma2-9b.lua", 9'241'705'984},
      {"gemma/gemma2-27b.lua", 27'227'128'320},
      {"gemma/gemma3-1b.lua", 999'885'952},
      // Gemma 3 4B, 12B and 27B: the language model, the published totals (4,300,079,472,
      // 12,187,325,040 and 27,432,406,640) less the SigLIP tower (416,866,032) and the
      // projector (1152 x dim + 1152).
      {"gemma/gemma3-4b.lua", 3'880'263'168},
      {"gemma/gemma3-12b.lua", 11'766'034'176},
      {"gemma/gemma3-27b.lua", 27'009'346'304},
      {"bloom/bloom-560m.lua", 559'214'592},
      {"bloom/bloom-7b1.lua", 7'069'016'064},
      {"bloom/bloom-176b.lua", 176'247'271'424},
      {"mixtral/mixtral-8x7b.lua", 46'702'792'704},
      {"qwen/qwen1.5-moe-a2.7b.lua", 14'315'784'192},
  };
  for (const auto& [file, count] : expected) {
    SCOPED_TRACE(file);
    const Recipe r = Recipe::load_file(recipe_path(file));
    EXPECT_EQ(parameter_count(r.config().model), count);
  }
}

TEST(Recipes, MixtralUsesTwoOfEightExpertsAToken) {
  const Recipe r = Recipe::load_file(recipe_path("mixtral/mixtral-8x7b.lua"));
  // Mistral AI's "12.9B active parameters".
  EXPECT_EQ(parameter_count(r.config().model) - inactive_expert_parameter_count(r.config().model), 12'879'925'248);
}

TEST(Recipes, QwenMoeUsesFourOfSixtyExpertsAndTheSharedOneAToken) {
  const Recipe r = Recipe::load_file(recipe_path("qwen/qwen1.5-moe-a2.7b.lua"));
  // Qwen's "2.7B activated": every parameter but 56 of each block's 60 experts.
  EXPECT_EQ(parameter_count(r.config().model) - inactive_expert_parameter_count(r.config().model), 2'689'173'504);
}

TEST(Recipes, LlamaFfnRule) {
  const Recipe r7 = Recipe::load_file(recipe_path("llama/llama-2-7b.lua"));
  EXPECT_EQ(resolved_ffn_dim(r7.config().model), 11008);
  const Recipe r70 = Recipe::load_file(recipe_path("llama/llama-2-70b.lua"));
  EXPECT_EQ(resolved_ffn_dim(r70.config().model), 28672);
  const Recipe r3 = Recipe::load_file(recipe_path("llama/llama-3-8b.lua"));
  EXPECT_EQ(resolved_ffn_dim(r3.config().model), 14336);
}

TEST(Recipes, PresetsFillFamilyDefaults) {
  const Recipe l = Recipe::load_string("return tide.recipe{ model = tide.models.llama{ dim = 64, n_heads = 4 } }", "@l.lua");
  EXPECT_EQ(l.config().model.family, Family::LLaMA);
  EXPECT_EQ(l.config().model.norm, NormKind::RMSNorm);
  EXPECT_EQ(l.config().model.positions, PositionKind::RoPE);
  EXPECT_FALSE(l.config().model.tie_embeddings);
  const Recipe b = Recipe::load_string("return tide.recipe{ model = tide.models.bloom{ dim = 64, n_heads = 4 } }", "@b.lua");
  EXPECT_EQ(b.config().model.family, Family::BLOOM);
  EXPECT_EQ(b.config().model.positions, PositionKind::ALiBi);
  EXPECT_TRUE(b.config().model.embedding_norm);
  EXPECT_TRUE(b.config().model.tie_embeddings);
  EXPECT_EQ(b.config().model.dim, 64);
  // Gemma: embeddings scaled by sqrt(dim) unless the recipe says otherwise.
  const Recipe g =
      Recipe::load_string("return tide.recipe{ model = tide.models.gemma{ dim = 64, n_heads = 4 } }", "@g.lua");
  EXPECT_EQ(g.config().model.family, Family::LLaMA);
  EXPECT_EQ(g.config().model.mlp, MlpKind::GeGLU);
  EXPECT_TRUE(g.config().model.norm_zero_centered);
  EXPECT_TRUE(g.config().model.tie_embeddings);
  EXPECT_EQ(g.config().model.embedding_scale, 8.0);
  const Recipe g1 = Recipe::load_string(
      "return tide.recipe{ model = tide.models.gemma{ dim = 64, n_heads = 4, embedding_scale = 1 } }", "@g.lua");
  EXPECT_EQ(g1.config().model.embedding_scale, 1.0);
  // Gemma 3: one layer in six attends in full, counted from 0 as layer 5, unless the
  // recipe lists its own; the others over the window with a RoPE base of their own.
  const Recipe g3 = Recipe::load_file(recipe_path("gemma/gemma3-1b.lua"));
  EXPECT_EQ(g3.config().model.full_attention_layers, (std::vector<int64_t>{5, 11, 17, 23}));
  EXPECT_EQ(g3.config().model.sliding_window, 512);
  EXPECT_EQ(g3.config().model.rope_local_theta, 1e4);
  EXPECT_EQ(g3.config().model.rope_theta, 1e6);
  EXPECT_TRUE(g3.config().model.post_norms && g3.config().model.qk_norm);
  const Recipe g3_given = Recipe::load_string(
      "return tide.recipe{ model = tide.models.gemma3{ dim = 64, n_heads = 4, n_layers = 4, "
      "full_attention_layers = { 1 } } }",
      "@g3.lua");
  EXPECT_EQ(g3_given.config().model.full_attention_layers, std::vector<int64_t>{1});
  const Recipe g3_short = Recipe::load_string(
      "return tide.recipe{ model = tide.models.gemma3{ dim = 64, n_heads = 4, n_layers = 4 } }", "@g3.lua");
  EXPECT_TRUE(g3_short.config().model.full_attention_layers.empty());
  // Gemma 2: the odd layers in full, soft-caps of 50 and 30, one RoPE base.
  const Recipe g2 = Recipe::load_file(recipe_path("gemma/gemma2-9b.lua"));
  EXPECT_EQ(g2.config().model.full_attention_layers.size(), 21u);
  EXPECT_EQ(g2.config().model.full_attention_layers.front(), 1);
  EXPECT_EQ(g2.config().model.full_attention_layers.back(), 41);
  EXPECT_EQ(g2.config().model.attention_softcap, 50);
  EXPECT_EQ(g2.config().model.final_logit_softcap, 30);
  EXPECT_EQ(g2.config().model.sliding_window, 4096);
  EXPECT_EQ(g2.config().model.rope_local_theta, 0);
  EXPECT_TRUE(g2.config().model.post_norms && !g2.config().model.qk_norm);
}

TEST(Recipes, FieldErrorsNameTheLineTheFieldAndTheValue) {
  const std::string e = error_of(
      "local base = 64\n"
      "return tide.recipe{\n"
      "  name = 'x',\n"
      "  model = tide.models.llama{ dim = base, n_heads = 7 },\n"
      "}\n");
  EXPECT_NE(e.find("r.lua:4:"), std::string::npos) << e;
  EXPECT_NE(e.find("model.n_heads"), std::string::npos) << e;
  EXPECT_NE(e.find("7"), std::string::npos) << e;
}

TEST(Recipes, UnknownFieldSuggestsTheNearestOne) {
  const std::string e = error_of("return tide.recipe{\n optimizer = { lrr = 1e-3 } }\n");
  EXPECT_NE(e.find("r.lua:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("optimizer.lrr: unknown field (did you mean 'optimizer.lr'?)"), std::string::npos) << e;
}

TEST(Recipes, WrongTypeNamesTheValue) {
  const std::string e = error_of("return tide.recipe{ schedule = { steps = 'many' } }\n");
  EXPECT_NE(e.find("schedule.steps: expected an integer, got \"many\""), std::string::npos) << e;
}

TEST(Recipes, MustReturnARecipe) {
  EXPECT_NE(error_of("return { name = 'x' }").find("must return tide.recipe"), std::string::npos);
  EXPECT_NE(error_of("return 5").find("must return tide.recipe"), std::string::npos);
}

TEST(Recipes, FunctionsOnlyWhereAllowed) {
  const std::string e = error_of("return tide.recipe{ optimizer = { lr = function() return 1 end } }\n");
  EXPECT_NE(e.find("optimizer.lr: is a function"), std::string::npos) << e;
}

TEST(Recipes, OverridesWinAndAreChecked) {
  const std::string text = "return tide.recipe{ optimizer = { lr = 1e-3 }, model = tide.models.llama{ dim = 64, n_heads = 4 } }";
  const Recipe r = Recipe::load_string(text, "@o.lua", {"optimizer.lr=5e-4", "model.n_layers=3", "name=abc"});
  EXPECT_DOUBLE_EQ(r.config().optimizer.lr, 5e-4);
  EXPECT_EQ(r.config().model.n_layers, 3);
  EXPECT_EQ(r.config().name, "abc");
  EXPECT_NE(error_of(text, {"model.n_heads=5"}).find("model.n_heads"), std::string::npos);
  EXPECT_NE(error_of(text, {"optimizer.lrate=1"}).find("did you mean 'optimizer.lr'"), std::string::npos);
  EXPECT_NE(error_of(text, {"novalue"}).find("key=value"), std::string::npos);
  // A list where the override needs a table (found by tests/fuzz: it threw the JSON
  // library's type_error).
  const std::string list = error_of("return tide.recipe{ schedule = { 1e-4 } }", {"schedule.steps=3"});
  EXPECT_NE(list.find("schedule.steps: the recipe's schedule is [0.0001], not a table"), std::string::npos) << list;
}

TEST(Recipes, ADataBlendIsAListOfTables) {
  const std::string text =
      "return tide.recipe{ data = { blend = { { path = 'data/web', weight = 7 },\n"
      "                                       { path = 'data/code', weight = 2, name = 'code' } } } }\n";
  const Recipe r = Recipe::load_string(text, "@b.lua");
  ASSERT_EQ(r.config().data.blend.size(), 2u);
  EXPECT_EQ(r.config().data.blend[0].path, "data/web");
  EXPECT_EQ(r.config().data.blend[0].weight, 7);
  EXPECT_EQ(r.config().data.blend[1].name, "code");
  // An override replaces the list, written as JSON.
  const Recipe o = Recipe::load_string(text, "@b.lua", {R"(data.blend=[{"path": "data/books"}])"});
  ASSERT_EQ(o.config().data.blend.size(), 1u);
  EXPECT_EQ(o.config().data.blend[0].path, "data/books");
  const std::string e = error_of("return tide.recipe{ data = { blend = { { path = 'a', weight = 'heavy' } } } }\n");
  EXPECT_NE(e.find("data.blend[1].weight: expected a number, got \"heavy\""), std::string::npos) << e;
}

TEST(Recipes, TextThatIsNotUtf8IsRefusedNamingTheField) {
  // A recipe's strings become JSON (config.json, the workers' wire), which holds only
  // UTF-8 (found by tests/fuzz: the schema's own message failed to print the value).
  const std::string text = "return tide.recipe{ schedule = { decay = \"cos\x9Ane\" } }";
  const std::string e = error_of(text);
  EXPECT_NE(e.find("schedule.decay: the string is not UTF-8 text (byte 0x9A at offset 3)"), std::string::npos) << e;
  const std::string o = error_of("return tide.recipe{}", {"name=\xD8\x31"});
  EXPECT_NE(o.find("not UTF-8 text (byte 0xD8 at offset 5)"), std::string::npos) << o;
}

TEST(Recipes, LuaScheduleFunction) {
  Recipe r = Recipe::load_string(
      "return tide.recipe{ optimizer = { lr = 1 }, schedule = { steps = 100, lr = function(step) return 1 / (step + 1) end } }",
      "@s.lua");
  EXPECT_EQ(r.config().schedule.decay, DecayKind::Lua);
  ASSERT_TRUE(r.has_lr_function());
  EXPECT_DOUBLE_EQ(r.lr_at(0), 1.0);
  EXPECT_DOUBLE_EQ(r.lr_at(3), 0.25);
  Recipe bad = Recipe::load_string("return tide.recipe{ schedule = { lr = function(step) return 'x' end } }", "@s.lua");
  EXPECT_THROW(bad.lr_at(0), RecipeError);
}

TEST(Recipes, ResolvedConfigRoundTripsThroughJson) {
  const Recipe r = Recipe::load_file(recipe_path("bloom/bloom-tiny.lua"));
  const RunConfig again = config_from_json(config_to_json(r.config()));
  EXPECT_EQ(config_to_json(again), config_to_json(r.config()));
}

TEST(Recipes, ResolveBundledName) {
  EXPECT_EQ(resolve_recipe_path("llama/llama-tiny"), recipes_dir() + "/llama/llama-tiny.lua");
  EXPECT_THROW(resolve_recipe_path("nope/nothing"), RecipeError);
}

}  // namespace
}  // namespace tide
