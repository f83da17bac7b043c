// The sandbox's string.find/match/gmatch/gsub against LuaJIT's own, on the same calls:
// a corpus of the pattern language's corners and thousands of generated patterns.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include <lua.hpp>

#include "lua_patterns.h"

namespace tide {
namespace {

bool always(lua_State*, int64_t) { return true; }
void never_raises(lua_State*) {}
const PatternBudget kUnlimited{&always, &never_raises};

struct State {
  explicit State(bool bounded) : L(luaL_newstate()) {
    luaL_openlibs(L);
    if (bounded) install_bounded_patterns(L, &kUnlimited);
  }
  ~State() { lua_close(L); }
  // What the chunk returns, as text, or "error" for an error (messages differ in wording).
  std::string run(const std::string& code) {
    if (luaL_loadstring(L, code.c_str()) != 0) return "load error";
    if (lua_pcall(L, 0, 1, 0) != 0) {
      lua_pop(L, 1);
      return "error";
    }
    std::string out = lua_isstring(L, -1) ? lua_tostring(L, -1) : luaL_typename(L, -1);
    lua_pop(L, 1);
    return out;
  }
  lua_State* L;
};

// Every result of every function, as one string: a mismatch shows which call differs.
std::string program(const std::string& s, const std::string& p) {
  const std::string qs = "'" + s + "'", qp = "'" + p + "'";
  return "local s, p = " + qs + ", " + qp + R"LUA(
local out = {}
local function show(...)
  local n = select('#', ...)
  local t = {}
  for i = 1, n do t[#t + 1] = tostring((select(i, ...))) end
  out[#out + 1] = table.concat(t, ',')
end
local function try(f, ...)
  local ok, a, b, c, d = pcall(f, ...)
  if ok then show(a, b, c, d) else out[#out + 1] = 'error' end
end
try(string.find, s, p)
try(string.find, s, p, 3)
try(string.find, s, p, -2)
try(string.match, s, p)
try(string.match, s, p, 2)
try(string.gsub, s, p, '<%0>')
try(string.gsub, s, p, '[%1]')
try(string.gsub, s, p, function(x) return x:upper() end)
try(string.gsub, s, p, {a = 'A', ab = 'AB'})
try(string.gsub, s, p, '-', 2)
local ok = pcall(function()
  for a, b in string.gmatch(s, p) do show(a, b) end
end)
if not ok then out[#out + 1] = 'error' end
return table.concat(out, '|')
)LUA";
}

TEST(LuaPatterns, CorpusMatchesLuaJit) {
  State ours(true), theirs(false);
  const std::pair<const char*, const char*> cases[] = {
      {"hello world", "o"},          {"hello world", "l+"},        {"hello world", "(%w+) (%w+)"},
      {"  trim me  ", "^%s*(.-)%s*$"}, {"key=value", "(%w+)=(%w+)"}, {"a.b.c", "%."},
      {"a.b.c", "."},                {"THE (quick) fox", "%f[%a]%a+"}, {"f(a(b)c)d", "%b()"},
      {"abcabc", "(abc)%1"},         {"x = 10, y = 20", "()(%a)()"}, {"aaa", "a-"},
      {"aaa", "a-$"},                {"aaab", "a*b"},               {"", ""},
      {"abc", ""},                   {"abc", "^"},                  {"abc", "$"},
      {"a$b", "$b"},                 {"[x]", "[]]"},                {"a-b", "[a-]"},
      {"a^b", "[%^^]"},              {"123abc", "[^%d]+"},          {"tab\there", "%c"},
      {"MiXeD", "%u%l"},             {"0x1F", "%x+"},               {"a,b;c", "[%p]"},
      {"abc", "[b-"},                {"abc", "%"},                  {"abc", "(a"},
      {"abc", "a)"},                 {"abc", "%1"},                 {"abc", "%f"},
      {"abc", "%b"},                 {"aaa", "a?a?a?aaa"},          {"ab", "a?b?c?"},
      {"hello", "l*"},               {"one two  three", "%s*"},     {"x", "[%a-z]"},
      {"\x01\x7f", "%C+"},           {"A1 b2", "%W"},               {"a.b", "%.?"},
  };
  for (const auto& [s, p] : cases) EXPECT_EQ(ours.run(program(s, p)), theirs.run(program(s, p))) << s << " ~ " << p;
}

TEST(LuaPatterns, GeneratedPatternsMatchLuaJit) {
  State ours(true), theirs(false);
  std::mt19937 rng(20261123);
  const std::string atoms[] = {"a", "b", ".", "%a", "%d", "%s", "[ab]", "[^a]", "[a-c]", "%%", "(", ")",
                               "()", "%b()", "%f[%w]", "%1", "x", " ", "$", "^"};
  const char* quantifiers[] = {"", "", "", "*", "+", "-", "?"};
  const std::string letters = "aab b(c)1 2x";
  auto pick = [&](int n) { return static_cast<size_t>(std::uniform_int_distribution<int>(0, n - 1)(rng)); };
  int compared = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string p, s;
    for (size_t k = 1 + pick(5); k > 0; --k) {
      const std::string& atom = atoms[pick(20)];
      p += atom;
      // A quantifier after a single-character class only: "%b()*" means "%b()" then '*'.
      if (atom.size() <= 2 && atom != "(" && atom != ")" && atom != "()" && atom != "%1" && atom != "$" &&
          atom != "^")
        p += quantifiers[pick(7)];
    }
    for (size_t k = pick(12); k > 0; --k) s += letters[pick(static_cast<int>(letters.size()))];
    const std::string code = program(s, p);
    ASSERT_EQ(ours.run(code), theirs.run(code)) << "'" << s << "' ~ '" << p << "'";
    ++compared;
  }
  EXPECT_EQ(compared, 3000);
}

}  // namespace
}  // namespace tide
