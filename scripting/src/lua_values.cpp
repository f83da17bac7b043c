#include "lua_values.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "tide/engine/io/utf8.h"

namespace tide {
namespace {

constexpr int kMaxDepth = 32;

struct Converter {
  lua_State* L;
  const std::function<nlohmann::json(const std::string&, int)>& on_function;
  std::map<std::string, std::string>& where;

  // Every string of a recipe becomes JSON (config.json, the wire to the workers), which
  // holds only UTF-8.
  static std::string utf8(std::string s, const std::string& path) {
    if (const size_t at = first_non_utf8(s); at != std::string::npos)
      throw std::runtime_error(fmt::format("{}: {} is not UTF-8 text (byte 0x{:02X} at offset {})",
                                           path.empty() ? "recipe" : path, path.empty() ? "a string" : "the string",
                                           static_cast<unsigned char>(s[at]), at));
    return s;
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  nlohmann::json convert(int index, const std::string& path, int depth) {
    index = index < 0 ? lua_gettop(L) + index + 1 : index;
    switch (lua_type(L, index)) {
      case LUA_TNIL: return nullptr;
      case LUA_TBOOLEAN: return lua_toboolean(L, index) != 0;
      case LUA_TNUMBER: {
        const double x = lua_tonumber(L, index);
        if (std::isfinite(x) && std::floor(x) == x && std::fabs(x) <= 9007199254740992.0)
          return static_cast<int64_t>(x);
        return x;
      }
      case LUA_TSTRING: {
        size_t len = 0;
        const char* s = lua_tolstring(L, index, &len);
        return utf8(std::string(s, len), path);
      }
      case LUA_TFUNCTION: return on_function(path, index);
      case LUA_TTABLE: return table(index, path, depth);
      default:
        throw std::runtime_error(fmt::format("{}: a {} cannot be part of a recipe", path.empty() ? "recipe" : path,
                                             lua_typename(L, lua_type(L, index))));
    }
  }

  nlohmann::json table(int index, const std::string& path, int depth) {
    if (depth > kMaxDepth) throw std::runtime_error(path + ": tables nested deeper than 32 levels (a cycle?)");
    lua_checkstack(L, 8);
    // An array when its keys are exactly 1..n.
    size_t n = 0, count = 0;
    bool all_positive_ints = true;
    lua_pushnil(L);
    while (lua_next(L, index) != 0) {
      ++count;
      if (lua_type(L, -2) == LUA_TNUMBER) {
        const double k = lua_tonumber(L, -2);
        if (k >= 1 && std::floor(k) == k) n = std::max(n, static_cast<size_t>(k));
        else all_positive_ints = false;
      } else {
        all_positive_ints = false;
      }
      lua_pop(L, 1);
    }
    if (count > 0 && all_positive_ints && n == count) {
      nlohmann::json arr = nlohmann::json::array();
      for (size_t i = 1; i <= n; ++i) {
        lua_rawgeti(L, index, static_cast<int>(i));
        arr.push_back(convert(-1, fmt::format("{}[{}]", path, i), depth + 1));
        lua_pop(L, 1);
      }
      return arr;
    }
    nlohmann::json obj = nlohmann::json::object();
    lua_pushnil(L);
    while (lua_next(L, index) != 0) {
      if (lua_type(L, -2) != LUA_TSTRING) {
        lua_pop(L, 2);
        throw std::runtime_error(fmt::format("{}: table keys must be names, found a {} key",
                                             path.empty() ? "recipe" : path, lua_typename(L, lua_type(L, -2))));
      }
      size_t key_len = 0;
      const char* key_bytes = lua_tolstring(L, -2, &key_len);
      const std::string key = utf8(std::string(key_bytes, key_len), path.empty() ? "a recipe key" : path + "'s key");
      if (key == "__where") {
        if (lua_type(L, -1) == LUA_TSTRING) where[path] = lua_tostring(L, -1);
      } else if (key != "__recipe") {
        obj[key] = convert(-1, join(path, key), depth + 1);
      }
      lua_pop(L, 1);
    }
    return obj;
  }
};

}  // namespace

LuaConversion lua_to_json(lua_State* L, int index,
                          const std::function<nlohmann::json(const std::string&, int)>& on_function) {
  LuaConversion out;
  Converter c{L, on_function, out.where};
  out.value = c.convert(index, "", 0);
  return out;
}

void push_json(lua_State* L, const nlohmann::json& value) {
  lua_checkstack(L, 4);
  switch (value.type()) {
    case nlohmann::json::value_t::boolean: lua_pushboolean(L, value.get<bool>() ? 1 : 0); return;
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
    case nlohmann::json::value_t::number_float: lua_pushnumber(L, value.get<double>()); return;
    case nlohmann::json::value_t::string: {
      const auto& s = value.get_ref<const std::string&>();
      lua_pushlstring(L, s.data(), s.size());
      return;
    }
    case nlohmann::json::value_t::array: {
      lua_createtable(L, static_cast<int>(value.size()), 0);
      int i = 1;
      for (const auto& item : value) {
        push_json(L, item);
        lua_rawseti(L, -2, i++);
      }
      return;
    }
    case nlohmann::json::value_t::object: {
      lua_createtable(L, 0, static_cast<int>(value.size()));
      for (const auto& [key, item] : value.items()) {
        lua_pushlstring(L, key.data(), key.size());
        push_json(L, item);
        lua_rawset(L, -3);
      }
      return;
    }
    default: lua_pushnil(L); return;
  }
}

}  // namespace tide
