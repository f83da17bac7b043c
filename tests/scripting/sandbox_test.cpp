// Adversarial recipes: each is refused with a clear error that names file:line.
#include <gtest/gtest.h>

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
  SandboxLimits limits;
  limits.seconds = 0.2;
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

}  // namespace
}  // namespace tide
