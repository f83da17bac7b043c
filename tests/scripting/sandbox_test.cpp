// Adversarial recipes: each is refused with a clear error that names file:line.
#include <gtest/gtest.h>

#include <chrono>

#include "tide/scripting/recipe.h"

namespace tide {
namespace {

std::string error_of(const std::string& text, SandboxLimits limits = {}) {
  try {
    Recipe::load_string(text, "@evil.lua", {}, limits);
  } catch (const RecipeError& e) {
    return e.what();
  }
  return "";
}

TEST(Sandbox, UnknownGlobalIsAnErrorWithLine) {
  const std::string e = error_of("local x = 1\nreturn tide.recipe{ model = undefined_thing }\n");
  EXPECT_NE(e.find("evil.lua:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("unknown global 'undefined_thing'"), std::string::npos) << e;
}

TEST(Sandbox, AssigningAGlobalIsRefused) {
  const std::string e = error_of("\n\nfoo = 3\nreturn tide.recipe{}\n");
  EXPECT_NE(e.find("evil.lua:3:"), std::string::npos) << e;
  EXPECT_NE(e.find("undeclared global 'foo'"), std::string::npos) << e;
}

TEST(Sandbox, BytecodeIsRefused) {
  const std::string bytecode("\x1bLJ\x02\x0a\x00\x01\x02", 9);
  const std::string e = error_of(bytecode);
  EXPECT_NE(e.find("evil.lua"), std::string::npos) << e;
  EXPECT_NE(e.find("binary"), std::string::npos) << e;
}

TEST(Sandbox, InfiniteLoopHitsTheInstructionBudget) {
  SandboxLimits limits;
  limits.instructions = 5'000'000;
  const std::string e = error_of("local n = 0\nwhile true do n = n + 1 end\n", limits);
  EXPECT_NE(e.find("evil.lua:2:"), std::string::npos) << e;
  EXPECT_NE(e.find("instruction budget exhausted"), std::string::npos) << e;
}

TEST(Sandbox, InfiniteLoopHitsTheDeadline) {
  // Only the deadline may end it: a fast machine runs the default 200 M instructions in
  // under 0.2 s.
  SandboxLimits limits;
  limits.seconds = 0.2;
  limits.instructions = int64_t{1} << 60;
  const std::string e = error_of("while true do end\n", limits);
  EXPECT_NE(e.find("time limit exceeded"), std::string::npos) << e;
}

TEST(Sandbox, PcallCannotSwallowTheAbort) {
  SandboxLimits limits;
  limits.instructions = 2'000'000;
  const std::string e = error_of(
      "for i = 1, 100 do\n"
      "  pcall(function() while true do end end)\n"
      "end\n"
      "return tide.recipe{}\n",
      limits);
  EXPECT_NE(e.find("instruction budget exhausted"), std::string::npos) << e;
}

TEST(Sandbox, MemoryBombHitsTheCap) {
  SandboxLimits limits;
  limits.memory_bytes = 16u << 20;
  const std::string e = error_of("local s = string.rep('x', 64 * 1024 * 1024)\nreturn tide.recipe{}\n", limits);
  EXPECT_NE(e.find("memory limit of 16 MiB exceeded"), std::string::npos) << e;
}

TEST(Sandbox, GrowingTableHitsTheCap) {
  SandboxLimits limits;
  limits.memory_bytes = 8u << 20;
  const std::string e = error_of("local t = {}\nfor i = 1, 1e8 do t[i] = {i} end\n", limits);
  EXPECT_NE(e.find("memory limit"), std::string::npos) << e;
}

TEST(Sandbox, NoOsIoRequireOrLoaders) {
  for (const char* name : {"os", "io", "require", "dofile", "loadfile", "loadstring", "load", "debug", "ffi", "jit",
                           "package", "collectgarbage", "setfenv", "getfenv"}) {
    const std::string text = std::string("\nlocal f = ") + name + "\nreturn tide.recipe{}\n";
    const std::string e = error_of(text);
    EXPECT_NE(e.find("evil.lua:2:"), std::string::npos) << name << ": " << e;
    EXPECT_NE(e.find(std::string("unknown global '") + name + "'"), std::string::npos) << name << ": " << e;
  }
}

TEST(Sandbox, OsExecuteAndIoOpenFailWithLine) {
  std::string e = error_of("\n\nos.execute('touch /tmp/tide-pwned')\n");
  EXPECT_NE(e.find("evil.lua:3:"), std::string::npos) << e;
  e = error_of("\nio.open('/etc/passwd')\n");
  EXPECT_NE(e.find("evil.lua:2:"), std::string::npos) << e;
}

TEST(Sandbox, StringDumpIsGone) {
  const std::string e = error_of("local d = string.dump(function() end)\n");
  EXPECT_NE(e.find("evil.lua:1:"), std::string::npos) << e;
}

TEST(Sandbox, RuntimeErrorCarriesFileAndLine) {
  const std::string e = error_of("local t = nil\n\n\nlocal x = t.field\n");
  EXPECT_NE(e.find("evil.lua:4:"), std::string::npos) << e;
}

TEST(Sandbox, SyntaxErrorCarriesFileAndLine) {
  const std::string e = error_of("return tide.recipe{\n  model = ,\n}\n");
  EXPECT_NE(e.find("evil.lua:2:"), std::string::npos) << e;
}

TEST(Sandbox, LrFunctionRunsUnderItsOwnBudget) {
  SandboxLimits limits;
  limits.call_instructions = 100'000;
  Recipe r = Recipe::load_string(
      "return tide.recipe{ schedule = { steps = 10, lr = function(step)\n"
      "  if step == 3 then while true do end end\n"
      "  return 0.001 * (step + 1) end } }\n",
      "@sched.lua", {}, limits);
  EXPECT_DOUBLE_EQ(r.lr_at(0), 0.001);
  EXPECT_DOUBLE_EQ(r.lr_at(1), 0.002);
  try {
    r.lr_at(3);
    FAIL() << "expected the budget to stop the function";
  } catch (const RecipeError& e) {
    EXPECT_NE(std::string(e.what()).find("sched.lua:1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("instruction budget"), std::string::npos) << e.what();
  }
  EXPECT_DOUBLE_EQ(r.lr_at(4), 0.005);  // the state stays usable
}

TEST(Sandbox, BacktrackingPatternHitsTheDeadline) {
  // Exponential backtracking in C, where no count hook fires: (19)^18 paths. Matching
  // steps are charged to the instruction budget too; it is lifted here so that only the
  // deadline can end the match, whatever the machine's speed (a fast one exhausts the
  // default 200 M before 0.5 s).
  SandboxLimits limits;
  limits.seconds = 0.5;
  limits.instructions = int64_t{1} << 60;
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of(
      "local s = ('a'):rep(18)\n"
      "local ok = pcall(string.find, s, ('a*'):rep(18) .. 'b')\n"
      "return tide.recipe{}\n",
      limits);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // The pcall on line 2 catches the abort; the re-armed hook raises it again on line 3.
  EXPECT_NE(e.find("evil.lua:3: time limit exceeded"), std::string::npos) << e;
  // The deadline is checked every 4096 matching steps: well under a millisecond apart.
  EXPECT_LT(took, 0.5 + 5.0) << e;
}

TEST(Sandbox, PatternsAreBoundedInEveryFunction) {
  SandboxLimits limits;
  limits.instructions = 20'000'000;
  for (const char* call : {"string.find(s, p)", "string.match(s, p)", "s:gsub(p, 'x')",
                           "(function() for m in s:gmatch(p) do end end)()", "s:find(p, 1, false)"}) {
    const std::string e = error_of(std::string("local s, p = ('a'):rep(30), ('a-'):rep(30) .. 'b'\nlocal r = ") +
                                       call + "\nreturn tide.recipe{}\n",
                                   limits);
    EXPECT_NE(e.find("evil.lua:2: instruction budget exhausted"), std::string::npos) << call << ": " << e;
  }
}

TEST(Sandbox, DeepPatternRecursionIsAnErrorNotACrash) {
  const std::string e = error_of("local r = string.find(('a'):rep(5000), ('a?'):rep(5000))\n");
  EXPECT_NE(e.find("evil.lua:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("pattern too complex"), std::string::npos) << e;
}

TEST(Sandbox, HugeSortIsCharged) {
  SandboxLimits limits;
  limits.instructions = 3'000'000;
  // Filling the table takes ~2e6 instructions; sorting 1e6 numbers ~2e7 comparisons in C.
  const std::string e = error_of("local t = {}\nfor i = 1, 1e6 do t[i] = -i end\ntable.sort(t)\n", limits);
  EXPECT_NE(e.find("evil.lua:3: instruction budget exhausted"), std::string::npos) << e;
  // A small sort works and sorts.
  Recipe r = Recipe::load_string(
      "local t = {3, 1, 2}\ntable.sort(t, function(a, b) return a > b end)\n"
      "return tide.recipe{ seed = t[1] * 100 + t[2] * 10 + t[3] }\n",
      "@ok.lua");
  EXPECT_EQ(r.config().seed, 321);
}

TEST(Sandbox, SlowPatternInAPolicyCallIsStoppedByItsBudget) {
  SandboxLimits limits;
  limits.call_seconds = 0.2;
  limits.call_instructions = int64_t{1} << 60;  // only the deadline may end it, however fast the machine
  Recipe r = Recipe::load_string(
      "return tide.recipe{ schedule = { steps = 10, lr = function(step)\n"
      "  if step == 2 then string.find(('a'):rep(16), ('a*'):rep(16) .. 'b') end\n"
      "  return 0.001 end } }\n",
      "@sched.lua", {}, limits);
  EXPECT_DOUBLE_EQ(r.lr_at(1), 0.001);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    r.lr_at(2);
    FAIL() << "the pattern ran to its end";
  } catch (const RecipeError& e) {
    EXPECT_NE(std::string(e.what()).find("sched.lua:2: time limit exceeded"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.2 + 5.0);
  EXPECT_DOUBLE_EQ(r.lr_at(3), 0.001);  // the state stays usable
}

// Hostile recipes, each ending with a clear error that names evil.lua within the limits
// (1 s, 5e6 instructions, 32 MiB): escapes, bombs, loops, tricks with metatables,
// coroutines and error objects.
TEST(Sandbox, HostileRecipeCorpusEndsWithClearErrors) {
  SandboxLimits limits;
  limits.seconds = 1.0;
  limits.instructions = 5'000'000;
  limits.memory_bytes = 32u << 20;
  const char* corpus[] = {
      "while true do end",
      "repeat until false",
      "for i = 1, math.huge do end",
      "local function f() return f() end\nf()",  // a proper tail call: a loop
      "local function f() f() end\nf()",         // unbounded recursion: stack overflow
      "local t = setmetatable({}, {__index = function(t, k) return t[k] end})\nlocal x = t.a",
      "local co = coroutine.wrap(function() while true do end end)\nco()",
      "local s = 'x'\nwhile true do s = s .. s end",
      "local t = {}\nwhile true do t[#t + 1] = t end",
      "string.rep('x', 1e9)",
      "local s = ('x'):rep(1e6)\nlocal t = {}\nfor i = 1, 1e6 do t[i] = s .. i end",
      "string.find(('a'):rep(20), ('a*'):rep(20) .. 'b')",
      "string.gsub(('a'):rep(5000), '(a-)(a-)(a-)b', '%1')",
      "for m in string.gmatch(('ab'):rep(2000), '.-.-.-c') do end",
      "string.find(('a'):rep(3000), ('a?'):rep(3000))",
      "local t = {}\nfor i = 1, 5e5 do t[i] = i end\ntable.sort(t, function(a, b) while true do end end)",
      "os.execute('id')",
      "io.open('/etc/passwd')",
      "require('ffi')",
      "local f = load('return 1')",
      "local f = loadstring('return 1')",
      "dofile('/etc/passwd')",
      "local d = debug.getinfo(1)",
      "local j = jit.off()",
      "local p = package.loaded",
      "setfenv(1, {})",
      "local g = getfenv(1)",
      "collectgarbage('stop')",
      "local x = string.dump(print)",
      "rawset(_G, 'x', 1)",
      "setmetatable(_G, nil)",
      "local ok = pcall(error)\nwhile true do pcall(function() while true do end end) end",
      "error(setmetatable({}, {__tostring = function() while true do end end}))",
      "error({})",
      "return tide.recipe{ model = tide.models.llama{ dim = 'huge' } }",
      "return tide.recipe{ name = '../../etc' }",
      "return 42",
      "tide = nil\nreturn tide.recipe{}",
  };
  int n = 0;
  for (const char* text : corpus) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string e = error_of(text, limits);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(e.find("evil.lua"), std::string::npos) << "[" << text << "] " << e;
    EXPECT_LT(took, 1.0 + 5.0) << text;
    ++n;
  }
  EXPECT_GE(n, 30);
}

}  // namespace
}  // namespace tide
