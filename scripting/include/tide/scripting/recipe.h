// Lua recipes: a recipe file returns `tide.recipe{ ... }`. It runs once, sandboxed, to
// declare a spec that C++ validates (config_schema); afterwards only small functions
// run, each call under its own budget: schedule.lr, and the policies on_anomaly and
// on_step (docs/recipes.md, "Policies").
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "tide/engine/config.h"

namespace tide {

// A recipe problem, located: "recipes/x.lua:12: model.n_heads: 7 does not divide ...".
class RecipeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct SandboxLimits {
  int64_t instructions = 200'000'000;  // VM instructions for the whole recipe
  double seconds = 10.0;               // wall-clock deadline
  size_t memory_bytes = 256u << 20;    // bytes the Lua state may allocate
  // Per call of a recipe function after loading (schedule.lr, a policy).
  int64_t call_instructions = 1'000'000;
  double call_seconds = 0.5;
};

class Recipe {
 public:
  // path: a recipe file; overrides: "a.b=value" applied after the recipe runs.
  static Recipe load_file(const std::string& path, const std::vector<std::string>& overrides = {},
                          const SandboxLimits& limits = {});
  static Recipe load_string(const std::string& text, const std::string& chunk_name,
                            const std::vector<std::string>& overrides = {}, const SandboxLimits& limits = {});

  Recipe(Recipe&&) noexcept;
  Recipe& operator=(Recipe&&) noexcept;
  ~Recipe();

  const RunConfig& config() const { return config_; }
  RunConfig& config() { return config_; }
  const std::string& source() const { return source_; }  // file path or chunk name

  // schedule.lr as a Lua function of the 0-based step.
  bool has_lr_function() const;
  double lr_at(int64_t step);  // throws RecipeError (non-number, negative, budget)

  // A policy: the recipe's top-level function `name` ("on_anomaly", "on_step").
  bool has_policy(const std::string& name) const;
  // Where the recipe's print() goes from now on (default: the process log). The sink is
  // called on the thread that runs the recipe's functions and must not re-enter it.
  void on_print(std::function<void(const std::string&)> sink);
  // Calls it with `arg` as a Lua table and returns its answer as JSON (nil: null).
  // Throws RecipeError naming the policy and where it is defined: a Lua error, the
  // budget, an answer that holds a function or another non-data value.
  nlohmann::json call_policy(const std::string& name, const nlohmann::json& arg);

  // Opaque sandbox state; public so the implementation's helpers can name it.
  struct Lua;

 private:
  Recipe();
  std::unique_ptr<Lua> lua_;
  RunConfig config_;
  std::string source_;
};

// Where the bundled recipes live: $TIDE_RECIPES, else the source tree's recipes/.
std::string recipes_dir();
// A recipe argument: an existing file, or a bundled name like "llama/llama-tiny".
std::string resolve_recipe_path(const std::string& name_or_path);
// A recipe a daemon's client names ("llama/llama-tiny", ".lua" optional): looked up in
// recipes_dir(), then in `dirs`, never elsewhere. The name is relative, holds no "..",
// and its file must lie inside the directory once symlinks are followed, because the
// client may not read the daemon's files. Throws RecipeError naming the name.
std::string resolve_recipe_name(const std::string& name, const std::vector<std::string>& dirs = {});

}  // namespace tide
