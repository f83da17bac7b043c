// string.find, string.match, string.gmatch and string.gsub for sandboxed Lua states.
//
// LuaJIT's own versions run in C, where the sandbox's count hook never fires: a
// backtracking pattern such as ('a*'):rep(18) .. 'b' over 18 'a's runs for minutes, and a
// long run of '?' items recurses until the C stack overflows. These versions keep Lua
// 5.1's pattern language (classes, sets, %b, %f, captures, back references, anchors) and
// results, but count their steps: every few thousand they ask the sandbox whether its
// instruction budget and deadline still hold, and their recursion is bounded.
#pragma once

#include <cstdint>

#include <lua.hpp>

namespace tide {

// The sandbox's side. `charge` is asked every few thousand matching steps with the steps
// taken since its last call; false stops the match, which then unwinds and calls
// `raise`, which raises the sandbox's error (a Lua error: it does not return).
struct PatternBudget {
  bool (*charge)(lua_State* L, int64_t steps);
  void (*raise)(lua_State* L);
};

// Replaces find, match, gmatch and gsub in the `string` table (and so in the string
// metatable's __index, which is that table). `budget` must outlive the state.
void install_bounded_patterns(lua_State* L, const PatternBudget* budget);

}  // namespace tide
