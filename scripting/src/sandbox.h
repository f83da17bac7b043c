// A LuaJIT state for untrusted recipe code: an allowlist of libraries (base without
// loaders, table, string, math, bit), text chunks only, the JIT off so the count hook
// fires, an instruction budget and deadline that pcall cannot swallow, and a memory
// cap enforced by the allocator. The library functions that can run long in C, where
// the hook never fires, are replaced or wrapped so that they count their work against
// the same budget: string.find/match/gmatch/gsub (lua_patterns.h) and table.sort.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <lua.hpp>

#include "tide/scripting/recipe.h"

namespace tide {

class Sandbox {
 public:
  explicit Sandbox(const SandboxLimits& limits);
  ~Sandbox();
  Sandbox(const Sandbox&) = delete;
  Sandbox& operator=(const Sandbox&) = delete;

  lua_State* state() { return L_; }
  // Where print() goes (default: the process log, at info).
  void set_print(std::function<void(const std::string&)> sink) { print_ = std::move(sink); }

  // Loads `text` (never bytecode) named `chunk_name` ("@path" for files) and calls it
  // with `nargs` arguments already pushed; leaves `nresults` values on the stack.
  void run(const std::string& text, const std::string& chunk_name, int nargs, int nresults);
  // Calls the function below `nargs` arguments on the stack under a fresh budget.
  void call(int nargs, int nresults, int64_t instructions, double seconds);

  // Work done inside C functions (pattern matching, sorting), charged as instructions;
  // false once the budget or the deadline is exceeded.
  static bool charge(lua_State* L, int64_t steps);
  // Raises the exceeded limit as a Lua error at the calling Lua line, armed so that no
  // pcall can swallow it (as the hook does).
  static void raise_tripped(lua_State* L);

 private:
  struct Budget {
    int64_t remaining = 0;
    std::chrono::steady_clock::time_point deadline;
    std::string tripped;  // why execution was aborted; empty while within budget
  };
  static void* allocate(void* ud, void* ptr, size_t osize, size_t nsize);
  static void hook(lua_State* L, lua_Debug* ar);
  static int bounded_sort(lua_State* L);
  static Sandbox* owner(lua_State* L);
  static int lua_print(lua_State* L);
  void protected_call(int nargs, int nresults);

  struct Memory {
    size_t used = 0, limit = 0;
    bool exceeded = false;
  } memory_;
  Budget budget_;
  std::function<void(const std::string&)> print_;
  lua_State* L_ = nullptr;
};

}  // namespace tide
