#include <iostream>
#include <memory>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "cli_common.h"
#include "tide/engine/config_schema.h"
#include "tide/scripting/recipe.h"

namespace tide::cli {

void add_recipe_command(CLI::App& app) {
  auto* recipe = app.add_subcommand("recipe", "Inspect and validate recipes");
  recipe->require_subcommand(1);

  struct Options {
    std::vector<std::string> recipes, overrides;
  };
  auto opt = std::make_shared<Options>();
  auto* show = recipe->add_subcommand("show", "Print the resolved configuration as JSON");
  show->add_option("recipe", opt->recipes, "Recipe file or bundled name")->required()->expected(1);
  add_overrides(*show, opt->overrides);
  show->callback([opt] {
    const Recipe r = Recipe::load_file(resolve_recipe_path(opt->recipes.at(0)), opt->overrides);
    nlohmann::json j = config_to_json(r.config());
    j["model"]["parameters"] = parameter_count(r.config().model);
    j["model"]["ffn_dim"] = resolved_ffn_dim(r.config().model);
    j["model"]["n_kv_heads"] = resolved_kv_heads(r.config().model);
    std::cout << j.dump(2) << std::endl;
  });

  auto* check = recipe->add_subcommand("check", "Validate recipes without training");
  check->add_option("recipes", opt->recipes, "Recipe files or bundled names")->required();
  add_overrides(*check, opt->overrides);
  check->callback([opt] {
    int failed = 0;
    for (const auto& name : opt->recipes) {
      try {
        const Recipe r = Recipe::load_file(resolve_recipe_path(name), opt->overrides);
        std::cout << "ok: " << r.source() << " (" << with_commas(parameter_count(r.config().model))
                  << " parameters)" << std::endl;
      } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        ++failed;
      }
    }
    if (failed) throw std::runtime_error(std::to_string(failed) + " recipe(s) failed validation");
  });

  auto* fields = recipe->add_subcommand("fields", "Print every recipe field as a Markdown table");
  fields->callback([] { std::cout << schema_markdown(); });
}

}  // namespace tide::cli
