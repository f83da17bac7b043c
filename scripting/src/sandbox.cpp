#include "sandbox.h"

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "lua_patterns.h"

namespace tide {
namespace {
constexpr int kHookEvery = 1000;  // instructions between budget checks

// Unknown globals are errors, both reading and assigning: a typo in a recipe must
// not silently become nil.
const char* const kStrictGlobals = R"LUA(
local mt = {}
mt.__index = function(_, k) error("unknown global '" .. tostring(k) .. "'", 2) end
mt.__newindex = function(_, k) error("assignment to undeclared global '" .. tostring(k) .. "' (declare it local)", 2) end
mt.__metatable = false
setmetatable(_G, mt)
)LUA";
}  // namespace

// The allocator's user data is the Sandbox itself, which lets the hook find it.
Sandbox* Sandbox::owner(lua_State* L) {
  void* ud = nullptr;
  lua_getallocf(L, &ud);
  return static_cast<Sandbox*>(ud);
}

int Sandbox::lua_print(lua_State* L) {
  std::string line;
  const int n = lua_gettop(L);
  for (int i = 1; i <= n; ++i) {
    size_t len = 0;
    lua_getglobal(L, "tostring");
    lua_pushvalue(L, i);
    lua_call(L, 1, 1);
    const char* s = lua_tolstring(L, -1, &len);
    if (i > 1) line += '\t';
    if (s) line.append(s, len);
    lua_pop(L, 1);
  }
  Sandbox* sb = owner(L);
  if (!sb->print_) {
    spdlog::info("recipe: {}", line);
    return 0;
  }
  try {  // no C++ exception may cross the Lua frames above
    sb->print_(line);
  } catch (const std::exception& e) {
    spdlog::warn("recipe: print failed ({}): {}", e.what(), line);
  }
  return 0;
}

void* Sandbox::allocate(void* ud, void* ptr, size_t osize, size_t nsize) {
  auto* sb = static_cast<Sandbox*>(ud);
  auto& m = sb->memory_;
  if (nsize == 0) {
    m.used -= ptr ? osize : 0;
    std::free(ptr);
    return nullptr;
  }
  const size_t old = ptr ? osize : 0;
  if (m.used - old + nsize > m.limit) {
    m.exceeded = true;
    return nullptr;  // Lua raises "not enough memory"
  }
  void* p = std::realloc(ptr, nsize);
  if (p) m.used = m.used - old + nsize;
  return p;
}

bool Sandbox::charge(lua_State* L, int64_t steps) {
  auto& b = owner(L)->budget_;
  if (b.tripped.empty()) {
    b.remaining -= steps;
    if (b.remaining < 0)
      b.tripped = "instruction budget exhausted";
    else if (std::chrono::steady_clock::now() > b.deadline)
      b.tripped = "time limit exceeded";
  }
  return b.tripped.empty();
}

void Sandbox::raise_tripped(lua_State* L) {
  lua_sethook(L, &Sandbox::hook, LUA_MASKCOUNT, 1);
  luaL_where(L, 1);
  lua_pushstring(L, owner(L)->budget_.tripped.c_str());
  lua_concat(L, 2);
  lua_error(L);
}

namespace {
const PatternBudget kPatternBudget{&Sandbox::charge, &Sandbox::raise_tripped};
}  // namespace

// table.sort in C: about n log2 n comparisons, charged before it starts. A Lua
// comparison function is counted by the hook as well.
int Sandbox::bounded_sort(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  const auto n = static_cast<int64_t>(lua_objlen(L, 1));
  int64_t log2n = 1;
  while ((int64_t{1} << log2n) < n) ++log2n;
  if (!charge(L, n * log2n)) raise_tripped(L);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, lua_gettop(L) - 1, 0);
  return 0;
}

void Sandbox::hook(lua_State* L, lua_Debug* ar) {
  const auto& b = owner(L)->budget_;
  if (!charge(L, kHookEvery)) {
    // Re-arm to fire on every instruction: a pcall that catches this error is
    // interrupted again at once, so the abort always reaches the top.
    lua_sethook(L, &Sandbox::hook, LUA_MASKCOUNT, 1);
    if (lua_getinfo(L, "Sl", ar) && ar->currentline > 0) {
      const char* src = ar->source[0] == '@' || ar->source[0] == '=' ? ar->source + 1 : ar->short_src;
      lua_pushfstring(L, "%s:%d: %s", src, ar->currentline, b.tripped.c_str());
    } else {
      lua_pushstring(L, b.tripped.c_str());
    }
    lua_error(L);
  }
}

Sandbox::Sandbox(const SandboxLimits& limits) {
  memory_.limit = limits.memory_bytes;
  L_ = lua_newstate(&Sandbox::allocate, this);
  if (!L_) throw RecipeError("cannot create a Lua state (LuaJIT refused the custom allocator)");
  // Count hooks never fire inside compiled traces: the JIT stays off in recipe states.
  luaJIT_setmode(L_, 0, LUAJIT_MODE_ENGINE | LUAJIT_MODE_OFF);
  const std::pair<const char*, lua_CFunction> libs[] = {{"", luaopen_base},
                                                        {LUA_TABLIBNAME, luaopen_table},
                                                        {LUA_STRLIBNAME, luaopen_string},
                                                        {LUA_MATHLIBNAME, luaopen_math},
                                                        {LUA_BITLIBNAME, luaopen_bit}};
  for (const auto& [name, open] : libs) {
    lua_pushcfunction(L_, open);
    lua_pushstring(L_, name);
    lua_call(L_, 1, 0);
  }
  for (const char* name : {"dofile", "loadfile", "load", "loadstring", "require", "module", "getfenv", "setfenv",
                           "newproxy", "collectgarbage", "gcinfo", "jit", "rawset", "rawget"}) {
    lua_pushnil(L_);
    lua_setglobal(L_, name);
  }
  lua_getglobal(L_, "string");
  lua_pushnil(L_);
  lua_setfield(L_, -2, "dump");  // would produce bytecode
  lua_pop(L_, 1);
  install_bounded_patterns(L_, &kPatternBudget);
  lua_getglobal(L_, "table");
  lua_getfield(L_, -1, "sort");
  lua_pushcclosure(L_, &Sandbox::bounded_sort, 1);
  lua_setfield(L_, -2, "sort");
  lua_pop(L_, 1);
  lua_pushcfunction(L_, lua_print);
  lua_setglobal(L_, "print");
  budget_.remaining = limits.instructions;
  budget_.deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                            std::chrono::duration<double>(limits.seconds));
  lua_sethook(L_, &Sandbox::hook, LUA_MASKCOUNT, kHookEvery);
  run(kStrictGlobals, "=strict", 0, 0);
}

Sandbox::~Sandbox() {
  if (L_) lua_close(L_);
}

void Sandbox::protected_call(int nargs, int nresults) {
  const int status = lua_pcall(L_, nargs, nresults, 0);
  if (status == 0 && budget_.tripped.empty()) return;
  std::string message = lua_isstring(L_, -1) ? lua_tostring(L_, -1) : "error object is not a string";
  if (status != 0) lua_pop(L_, 1);
  if (!budget_.tripped.empty()) {
    // Whatever pcall inside the script turned the abort into, report the abort.
    if (message.find(budget_.tripped) == std::string::npos) message = budget_.tripped + " (" + message + ")";
  } else if (memory_.exceeded && message.find("not enough memory") != std::string::npos) {
    message = fmt::format("memory limit of {} MiB exceeded", memory_.limit >> 20);
  }
  memory_.exceeded = false;
  throw RecipeError(message);
}

void Sandbox::run(const std::string& text, const std::string& chunk_name, int nargs, int nresults) {
  if (luaL_loadbufferx(L_, text.data(), text.size(), chunk_name.c_str(), "t") != 0) {
    std::string message = lua_tostring(L_, -1);
    lua_pop(L_, 1 + nargs);
    if (!text.empty() && text[0] == '\x1b')
      message = fmt::format("{}: binary (precompiled) chunks are not accepted; recipes are Lua source text",
                            chunk_name.substr(chunk_name[0] == '@' || chunk_name[0] == '=' ? 1 : 0));
    throw RecipeError(message);
  }
  if (nargs > 0) lua_insert(L_, -(nargs + 1));
  try {
    protected_call(nargs, nresults);
  } catch (const RecipeError& e) {
    // Errors without a place (memory, error objects that are not strings) still name
    // the file, as every other error does.
    const std::string where = chunk_name.substr(chunk_name[0] == '@' || chunk_name[0] == '=' ? 1 : 0);
    if (std::string(e.what()).rfind(where, 0) == 0) throw;
    throw RecipeError(where + ": " + e.what());
  }
}

void Sandbox::call(int nargs, int nresults, int64_t instructions, double seconds) {
  budget_.remaining = instructions;
  budget_.tripped.clear();
  budget_.deadline = std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                            std::chrono::duration<double>(seconds));
  lua_sethook(L_, &Sandbox::hook, LUA_MASKCOUNT, kHookEvery);
  protected_call(nargs, nresults);
}

}  // namespace tide
