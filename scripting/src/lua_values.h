// Lua values ↔ JSON: recipe tables as the engine's config schema reads them, and the
// arguments and answers of recipe policies.
#pragma once

#include <functional>
#include <map>
#include <string>

#include <lua.hpp>
#include <nlohmann/json.hpp>

namespace tide {

struct LuaConversion {
  nlohmann::json value;
  std::map<std::string, std::string> where;  // table path → "file:line" it was declared at
};

// Converts the value at `index`. Functions are handed to on_function(path, index),
// which returns the JSON to store in their place or throws. Numbers that are whole
// become integers. Errors (std::runtime_error) name the field path.
LuaConversion lua_to_json(lua_State* L, int index,
                          const std::function<nlohmann::json(const std::string& path, int index)>& on_function);

// Pushes `value` as a Lua value: objects and arrays become tables, null becomes nil.
void push_json(lua_State* L, const nlohmann::json& value);

}  // namespace tide
