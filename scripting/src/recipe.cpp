#include "tide/scripting/recipe.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "lua_values.h"
#include "sandbox.h"
#include "tide/engine/config_schema.h"

namespace tide {
extern const char* const kTideLuaSource;
namespace fs = std::filesystem;

struct Recipe::Lua {
  explicit Lua(const SandboxLimits& l) : limits(l), sandbox(l) {}
  struct Function {
    int ref = LUA_NOREF;  // in the registry
    std::string where;    // "file:line" of its definition
  };
  SandboxLimits limits;
  Sandbox sandbox;
  std::map<std::string, Function> functions;  // by recipe path: schedule.lr, on_anomaly, on_step
  const Function* find(const std::string& path) const {
    const auto it = functions.find(path);
    return it == functions.end() ? nullptr : &it->second;
  }
};

namespace {

// Recipe functions the engine calls with what happened and acts on their answer.
const std::array<std::string, 2> kPolicies = {"on_anomaly", "on_step"};

// where(level) → "file:line" of the caller `level` frames up; recipe errors found in
// C++ after the script has finished point there.
int lua_where(lua_State* L) {
  const int level = static_cast<int>(luaL_optinteger(L, 1, 1));
  lua_Debug ar;
  if (lua_getstack(L, level, &ar) && lua_getinfo(L, "Sl", &ar)) {
    const char* src = ar.source[0] == '@' || ar.source[0] == '=' ? ar.source + 1 : ar.short_src;
    lua_pushfstring(L, "%s:%d", src, ar.currentline);
  } else {
    lua_pushstring(L, "?");
  }
  return 1;
}

// Where a field's error should point. Tables made by tide.models.* know the line they
// were declared on; otherwise the line of `tide.recipe`. Within that region the first
// line assigning the field's own key is the most precise answer.
class Locator {
 public:
  Locator(const std::string& text, std::string file, std::map<std::string, std::string> where)
      : file_(std::move(file)), where_(std::move(where)) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) lines_.push_back(line);
    recipe_line_ = find_line("tide.recipe", 1);
  }

  std::string operator()(const std::string& field) const {
    int start = recipe_line_ > 0 ? recipe_line_ : 1;
    std::string best = recipe_line_ > 0 ? fmt::format("{}:{}", file_, recipe_line_) : file_;
    size_t best_len = 0;
    for (const auto& [path, loc] : where_) {
      const bool prefix = !path.empty() && (field == path || field.rfind(path + ".", 0) == 0);
      if (prefix && path.size() >= best_len) {
        best = loc;
        best_len = path.size();
        const auto colon = loc.rfind(':');
        if (colon != std::string::npos) start = std::atoi(loc.c_str() + colon + 1);
      }
    }
    const std::string key = field.substr(field.rfind('.') + 1);
    if (const int line = find_assignment(key, start); line > 0) return fmt::format("{}:{}", file_, line);
    return best;
  }

 private:
  int find_line(const std::string& needle, int from) const {
    for (size_t i = static_cast<size_t>(std::max(from, 1)) - 1; i < lines_.size(); ++i)
      if (lines_[i].find(needle) != std::string::npos) return static_cast<int>(i) + 1;
    return 0;
  }
  int find_assignment(const std::string& key, int from) const {
    for (size_t i = static_cast<size_t>(std::max(from, 1)) - 1; i < lines_.size(); ++i) {
      const std::string& l = lines_[i];
      for (size_t pos = l.find(key); pos != std::string::npos; pos = l.find(key, pos + 1)) {
        const bool word_start = pos == 0 || !(std::isalnum(static_cast<unsigned char>(l[pos - 1])) || l[pos - 1] == '_');
        size_t after = pos + key.size();
        while (after < l.size() && l[after] == ' ') ++after;
        if (word_start && after < l.size() && l[after] == '=' && (after + 1 >= l.size() || l[after + 1] != '='))
          return static_cast<int>(i) + 1;
      }
    }
    return 0;
  }

  std::string file_;
  std::map<std::string, std::string> where_;
  std::vector<std::string> lines_;
  int recipe_line_ = 0;
};

std::string display_name(const std::string& chunk_name) {
  return chunk_name.empty() ? "recipe" : (chunk_name[0] == '@' || chunk_name[0] == '=') ? chunk_name.substr(1)
                                                                                        : chunk_name;
}

}  // namespace

namespace {
// Runs the recipe's text with the tide library loaded; leaves the tide.recipe{...} table
// it returned on the stack, or throws naming `source`.
void evaluate_recipe(Sandbox& sb, const std::string& text, const std::string& chunk_name,
                     const std::string& source) {
  lua_State* L = sb.state();
  lua_pushcfunction(L, lua_where);
  sb.run(kTideLuaSource, "=tide.lua", 1, 1);
  lua_pushstring(L, "tide");
  lua_insert(L, -2);
  lua_rawset(L, LUA_GLOBALSINDEX);

  const std::string chunk = chunk_name.empty() || (chunk_name[0] != '@' && chunk_name[0] != '=') ? "@" + chunk_name
                                                                                                 : chunk_name;
  sb.run(text, chunk, 0, 1);
  if (!lua_istable(L, -1))
    throw RecipeError(fmt::format("{}: the recipe must return tide.recipe{{...}}, it returned {}", source,
                                  lua_typename(L, lua_type(L, -1))));
  lua_getfield(L, -1, "__recipe");
  const bool marked = lua_toboolean(L, -1) != 0;
  lua_pop(L, 1);
  if (!marked)
    throw RecipeError(fmt::format("{}: the recipe must return tide.recipe{{...}}, it returned a plain table", source));
}
}  // namespace

Recipe::Recipe() = default;
Recipe::Recipe(Recipe&&) noexcept = default;
Recipe& Recipe::operator=(Recipe&&) noexcept = default;
Recipe::~Recipe() = default;  // closing the Lua state frees the functions' references

Recipe Recipe::load_string(const std::string& text, const std::string& chunk_name,
                           const std::vector<std::string>& overrides, const SandboxLimits& limits) {
  Recipe r;
  r.source_ = display_name(chunk_name);
  r.lua_ = std::make_unique<Lua>(limits);
  lua_State* L = r.lua_->sandbox.state();
  evaluate_recipe(r.lua_->sandbox, text, chunk_name, r.source_);

  LuaConversion conv;
  try {
    conv = lua_to_json(L, -1, [&](const std::string& path, int index) -> nlohmann::json {
      if (path != "schedule.lr" && std::find(kPolicies.begin(), kPolicies.end(), path) == kPolicies.end())
        throw ConfigError(path, "is a function; only schedule.lr (a function of the step), on_anomaly and on_step "
                                "may be functions");
      lua_Debug ar;
      lua_pushvalue(L, index);
      lua_getinfo(L, ">S", &ar);
      Lua::Function& f = r.lua_->functions[path];
      f.where = fmt::format("{}:{}", display_name(ar.source), ar.linedefined);
      lua_pushvalue(L, index);
      f.ref = luaL_ref(L, LUA_REGISTRYINDEX);
      return "lua";
    });
  } catch (const ConfigError& e) {
    throw RecipeError(fmt::format("{}: {}", r.source_, e.what()));
  } catch (const std::runtime_error& e) {
    throw RecipeError(fmt::format("{}: {}", r.source_, e.what()));
  }
  lua_pop(L, 1);

  nlohmann::json j = std::move(conv.value);
  for (const auto& name : kPolicies) {
    if (j.contains(name) && !r.lua_->find(name))
      throw RecipeError(fmt::format("{}: {}: must be a function, got {}", r.source_, name, j[name].dump()));
    j.erase(name);
  }
  const Locator locate(text, r.source_, conv.where);
  if (j.contains("schedule") && j["schedule"].contains("lr")) {
    // schedule.lr (a function) is the Lua schedule: it sets schedule.decay = "lua".
    auto& sched = j["schedule"];
    if (sched.contains("decay") && sched["decay"] != "lua")
      throw RecipeError(fmt::format("{}: schedule.decay: {} conflicts with schedule.lr, a function of the step",
                                    locate("schedule.decay"), sched["decay"].dump()));
    sched.erase("lr");
    sched["decay"] = "lua";
  }
  for (const auto& o : overrides) {
    try {
      apply_override(j, o);
    } catch (const ConfigError& e) {
      throw RecipeError(fmt::format("--set {}: {}", o, e.what()));
    }
  }
  try {
    r.config_ = config_from_json(j);
  } catch (const ConfigError& e) {
    throw RecipeError(fmt::format("{}: {}", locate(e.field()), e.what()));
  }
  if (r.config_.schedule.decay == DecayKind::Lua && !r.lua_->find("schedule.lr"))
    throw RecipeError(fmt::format("{}: schedule.decay: \"lua\" needs schedule.lr to be a function of the step",
                                  locate("schedule.decay")));
  return r;
}

Recipe Recipe::load_file(const std::string& path, const std::vector<std::string>& overrides,
                         const SandboxLimits& limits) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RecipeError(fmt::format("cannot read recipe '{}'", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return load_string(ss.str(), "@" + path, overrides, limits);
}

bool Recipe::has_lr_function() const { return lua_ && lua_->find("schedule.lr"); }

double Recipe::lr_at(int64_t step) {
  const Lua::Function* f = lua_ ? lua_->find("schedule.lr") : nullptr;
  if (!f) throw RecipeError(source_ + ": schedule.lr is not a function");
  lua_State* L = lua_->sandbox.state();
  lua_rawgeti(L, LUA_REGISTRYINDEX, f->ref);
  lua_pushnumber(L, static_cast<lua_Number>(step));
  try {
    lua_->sandbox.call(1, 1, lua_->limits.call_instructions, lua_->limits.call_seconds);
  } catch (const RecipeError& e) {
    throw RecipeError(fmt::format("schedule.lr (defined at {}) at step {}: {}", f->where, step, e.what()));
  }
  const bool is_number = lua_type(L, -1) == LUA_TNUMBER;
  const double lr = is_number ? lua_tonumber(L, -1) : 0.0;
  const std::string got = is_number ? fmt::format("{}", lr) : lua_typename(L, lua_type(L, -1));
  lua_pop(L, 1);
  if (!is_number || !std::isfinite(lr) || lr < 0)
    throw RecipeError(fmt::format("schedule.lr (defined at {}) returned {} at step {}; it must return a finite "
                                  "number >= 0",
                                  f->where, got, step));
  return lr;
}

bool Recipe::has_policy(const std::string& name) const {
  return lua_ && std::find(kPolicies.begin(), kPolicies.end(), name) != kPolicies.end() && lua_->find(name);
}

nlohmann::json Recipe::call_policy(const std::string& name, const nlohmann::json& arg) {
  if (!has_policy(name)) throw RecipeError(fmt::format("{}: the recipe defines no {} policy", source_, name));
  const Lua::Function& f = *lua_->find(name);
  lua_State* L = lua_->sandbox.state();
  lua_rawgeti(L, LUA_REGISTRYINDEX, f.ref);
  push_json(L, arg);
  try {
    lua_->sandbox.call(1, 1, lua_->limits.call_instructions, lua_->limits.call_seconds);
  } catch (const RecipeError& e) {
    throw RecipeError(fmt::format("{} (defined at {}): {}", name, f.where, e.what()));
  }
  nlohmann::json answer;
  try {
    answer = lua_to_json(L, -1, [&](const std::string& path, int) -> nlohmann::json {
               throw std::runtime_error(path + ": a function is not an answer");
             }).value;
  } catch (const std::runtime_error& e) {
    lua_pop(L, 1);
    throw RecipeError(fmt::format("{} (defined at {}) answered something that is not plain data: {}", name, f.where,
                                  e.what()));
  }
  lua_pop(L, 1);
  return answer;
}

void Recipe::on_print(std::function<void(const std::string&)> sink) { lua_->sandbox.set_print(std::move(sink)); }

std::string recipes_dir() {
  if (const char* env = std::getenv("TIDE_RECIPES"); env && *env) return env;
  return std::string(TIDE_SOURCE_DIR) + "/recipes";
}

std::string resolve_recipe_path(const std::string& name) {
  if (fs::is_regular_file(name)) return name;
  for (const std::string& candidate : {recipes_dir() + "/" + name, recipes_dir() + "/" + name + ".lua"})
    if (fs::is_regular_file(candidate)) return candidate;
  throw RecipeError(fmt::format("recipe '{}' is neither a file nor a bundled recipe under {}", name, recipes_dir()));
}

std::string resolve_recipe_name(const std::string& name, const std::vector<std::string>& dirs) {
  const fs::path rel(name);
  bool plain = !name.empty() && name.size() <= 256 && rel.is_relative() && name.find('\0') == std::string::npos;
  for (const auto& part : rel) plain = plain && part != ".." && part != ".";
  if (!plain)
    throw RecipeError(fmt::format("recipe name '{}' is not a plain relative name such as llama/llama-tiny", name));
  std::vector<std::string> roots{recipes_dir()};
  roots.insert(roots.end(), dirs.begin(), dirs.end());
  for (const auto& root : roots) {
    std::error_code ec;
    const fs::path base = fs::canonical(root, ec);
    if (ec) continue;
    for (const fs::path& candidate : {base / rel, base / (name + ".lua")}) {
      if (!fs::is_regular_file(candidate, ec)) continue;
      const fs::path real = fs::canonical(candidate, ec);
      const auto [end, _] = std::mismatch(base.begin(), base.end(), real.begin(), real.end());
      if (!ec && end == base.end()) return real.string();
    }
  }
  throw RecipeError(fmt::format("no recipe named '{}' among the recipes of {}", name, fmt::join(roots, ", ")));
}

}  // namespace tide
