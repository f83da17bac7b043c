// A LuaJIT state for untrusted recipe code: an allowlist of libraries (base without
// loaders, table, string, math, bit), text chunks only, the JIT off so the count hook
// fires, an instruction budget and deadline that pcall cannot swallow, and a memory
// cap enforced by the allocator.
#pragma once

#include <chrono>
#include <cstdint>
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

  // Loads `text` (never bytecode) named `chunk_name` ("@path" for files) and calls it
  // with `nargs` arguments already pushed; leaves `nresults` values on the stack.
  void run(const std::string& text, const std::string& chunk_name, int nargs, int nresults);
  // Calls the function below `nargs` arguments on the stack under a fresh budget.
  void call(int nargs, int nresults, int64_t instructions, double seconds);

 private:
  struct Budget {
    int64_t remaining = 0;
    std::chrono::steady_clock::time_point deadline;
    std::string tripped;  // why execution was aborted; empty while within budget
  };
  static void* allocate(void* ud, void* ptr, size_t osize, size_t nsize);
  static void hook(lua_State* L, lua_Debug* ar);
  void protected_call(int nargs, int nresults);

  struct Memory {
    size_t used = 0, limit = 0;
    bool exceeded = false;
  } memory_;
  Budget budget_;
  lua_State* L_ = nullptr;
};

}  // namespace tide
