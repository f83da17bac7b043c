#include "lua_patterns.h"

#include <cstddef>
#include <cstring>

namespace tide {
namespace {

// Lua 5.1's limits: captures per pattern, and (as Lua 5.2 added) the depth of the
// matcher's recursion, which a pattern of many '?' or '*' items would otherwise drive
// off the end of the C stack.
constexpr int kMaxCaptures = 32;
constexpr int kMaxDepth = 200;
constexpr int64_t kStepsPerCharge = 4096;
constexpr ptrdiff_t kUnfinished = -1, kPosition = -2;

// Why a match stopped early. The matcher never raises from inside its recursion: it
// unwinds with a reason, and the entry point raises once its own frame is plain C.
enum class Stop { none, budget, error };

struct Match {
  lua_State* L;
  const PatternBudget* budget;
  const char* src_init;
  const char* src_end;
  int level = 0;
  struct {
    const char* init;
    ptrdiff_t len;
  } capture[kMaxCaptures];
  int depth = 0;
  int64_t steps = 0;
  Stop stop = Stop::none;
  const char* error = nullptr;  // a static message when stop == error

  // One unit of work; false once the match must stop.
  bool step() {
    if (stop != Stop::none) return false;
    if (++steps < kStepsPerCharge) return true;
    const int64_t n = steps;
    steps = 0;
    if (!budget->charge(L, n)) stop = Stop::budget;
    return stop == Stop::none;
  }
  const char* fail(const char* message) {
    if (stop == Stop::none) {
      stop = Stop::error;
      error = message;
    }
    return nullptr;
  }
};

// ASCII classes, as LuaJIT's are: independent of the process' locale.
bool is_lower(int c) { return c >= 'a' && c <= 'z'; }
bool is_upper(int c) { return c >= 'A' && c <= 'Z'; }
bool is_digit(int c) { return c >= '0' && c <= '9'; }
bool is_alpha(int c) { return is_lower(c) || is_upper(c); }
bool is_space(int c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool is_cntrl(int c) { return c < 32 || c == 127; }
bool is_punct(int c) { return c > 32 && c < 127 && !is_alpha(c) && !is_digit(c); }
bool is_xdigit(int c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
int uchar(char c) { return static_cast<unsigned char>(c); }

bool class_matches(int c, int cl) {
  bool res;
  switch (cl | 0x20) {  // the lower-case letter; its upper case is the complement
    case 'a': res = is_alpha(c); break;
    case 'c': res = is_cntrl(c); break;
    case 'd': res = is_digit(c); break;
    case 'l': res = is_lower(c); break;
    case 'p': res = is_punct(c); break;
    case 's': res = is_space(c); break;
    case 'u': res = is_upper(c); break;
    case 'w': res = is_alpha(c) || is_digit(c); break;
    case 'x': res = is_xdigit(c); break;
    case 'z': res = c == 0; break;
    default: return cl == c;  // an escaped literal: %. %% %[
  }
  return is_upper(cl) ? !res : res;
}

// p at '[', end at the closing ']'.
bool set_matches(int c, const char* p, const char* end) {
  bool found = true;
  if (p[1] == '^') {
    found = false;
    ++p;
  }
  while (++p < end) {
    if (*p == '%') {
      ++p;
      if (class_matches(c, uchar(*p))) return found;
    } else if (p[1] == '-' && p + 2 < end) {
      p += 2;
      if (uchar(p[-2]) <= c && c <= uchar(*p)) return found;
    } else if (uchar(*p) == c) {
      return found;
    }
  }
  return !found;
}

// The end of the single-character class starting at p, or null (m.error set).
const char* class_end(Match& m, const char* p) {
  if (*p == '%') {
    if (p[1] == '\0') return m.fail("malformed pattern (ends with '%')");
    return p + 2;
  }
  if (*p == '[') {
    ++p;
    if (*p == '^') ++p;
    do {  // the first character of a set may be ']'
      if (*p == '\0') return m.fail("malformed pattern (missing ']')");
      if (*p++ == '%' && *p != '\0') ++p;
    } while (*p != ']');
    return p + 1;
  }
  return p + 1;
}

bool single_matches(const Match& m, const char* s, const char* p, const char* ep) {
  if (s >= m.src_end) return false;
  const int c = uchar(*s);
  switch (*p) {
    case '.': return true;
    case '%': return class_matches(c, uchar(p[1]));
    case '[': return set_matches(c, p, ep - 1);
    default: return uchar(*p) == c;
  }
}

const char* match(Match& m, const char* s, const char* p);

const char* max_expand(Match& m, const char* s, const char* p, const char* ep) {
  ptrdiff_t i = 0;
  while (single_matches(m, s + i, p, ep)) {
    if (!m.step()) return nullptr;
    ++i;
  }
  for (; i >= 0; --i) {  // the longest repetition first, then shorter ones
    if (!m.step()) return nullptr;
    if (const char* res = match(m, s + i, ep + 1)) return res;
    if (m.stop != Stop::none) return nullptr;
  }
  return nullptr;
}

const char* min_expand(Match& m, const char* s, const char* p, const char* ep) {
  for (;;) {
    if (!m.step()) return nullptr;
    if (const char* res = match(m, s, ep + 1)) return res;
    if (m.stop != Stop::none) return nullptr;
    if (!single_matches(m, s, p, ep)) return nullptr;
    ++s;
  }
}

// %bxy: s must start with x; the match ends at the y that balances it.
const char* match_balance(Match& m, const char* s, const char* p) {
  if (p[0] == '\0' || p[1] == '\0') return m.fail("unbalanced pattern (%b needs two characters)");
  if (s >= m.src_end || *s != p[0]) return nullptr;
  int open = 1;
  while (++s < m.src_end) {
    if (!m.step()) return nullptr;
    if (*s == p[1]) {
      if (--open == 0) return s + 1;
    } else if (*s == p[0]) {
      ++open;
    }
  }
  return nullptr;
}

const char* start_capture(Match& m, const char* s, const char* p, ptrdiff_t what) {
  if (m.level >= kMaxCaptures) return m.fail("too many captures");
  m.capture[m.level].init = s;
  m.capture[m.level].len = what;
  ++m.level;
  const char* res = match(m, s, p);
  if (!res) --m.level;
  return res;
}

const char* end_capture(Match& m, const char* s, const char* p) {
  int open = m.level - 1;
  while (open >= 0 && m.capture[open].len != kUnfinished) --open;
  if (open < 0) return m.fail("invalid pattern capture");
  m.capture[open].len = s - m.capture[open].init;
  const char* res = match(m, s, p);
  if (!res) m.capture[open].len = kUnfinished;
  return res;
}

// %1 .. %9: the text of an earlier, closed capture.
const char* match_back_reference(Match& m, const char* s, int digit) {
  const int l = digit - '1';
  if (l < 0 || l >= m.level || m.capture[l].len == kUnfinished) return m.fail("invalid capture index");
  const auto len = static_cast<size_t>(m.capture[l].len);
  if (static_cast<size_t>(m.src_end - s) < len) return nullptr;
  m.steps += static_cast<int64_t>(len);
  if (!m.step()) return nullptr;
  return std::memcmp(m.capture[l].init, s, len) == 0 ? s + len : nullptr;
}

const char* match_item(Match& m, const char* s, const char* p) {
  for (;;) {
    if (!m.step()) return nullptr;
    switch (*p) {
      case '\0': return s;  // the pattern is used up: a match
      case '(':
        if (p[1] == ')') return start_capture(m, s, p + 2, kPosition);
        return start_capture(m, s, p + 1, kUnfinished);
      case ')': return end_capture(m, s, p + 1);
      case '$':
        if (p[1] == '\0') return s == m.src_end ? s : nullptr;
        break;  // a '$' elsewhere is a literal
      case '%':
        if (p[1] == 'b') {
          s = match_balance(m, s, p + 2);
          if (!s) return nullptr;
          p += 4;
          continue;
        }
        if (p[1] == 'f') {  // frontier: the transition into the set
          p += 2;
          if (*p != '[') return m.fail("missing '[' after '%f' in pattern");
          const char* ep = class_end(m, p);
          if (!ep) return nullptr;
          const int previous = s == m.src_init ? 0 : uchar(s[-1]);
          const int current = s < m.src_end ? uchar(*s) : 0;
          if (set_matches(previous, p, ep - 1) || !set_matches(current, p, ep - 1)) return nullptr;
          p = ep;
          continue;
        }
        if (is_digit(uchar(p[1]))) {
          s = match_back_reference(m, s, uchar(p[1]));
          if (!s) return nullptr;
          p += 2;
          continue;
        }
        break;
      default: break;
    }
    const char* ep = class_end(m, p);
    if (!ep) return nullptr;
    const bool one = single_matches(m, s, p, ep);
    switch (*ep) {
      case '?':
        if (one) {
          if (const char* res = match(m, s + 1, ep + 1)) return res;
          if (m.stop != Stop::none) return nullptr;
        }
        p = ep + 1;
        continue;
      case '*': return max_expand(m, s, p, ep);
      case '+': return one ? max_expand(m, s + 1, p, ep) : nullptr;
      case '-': return min_expand(m, s, p, ep);
      default:
        if (!one) return nullptr;
        ++s;
        p = ep;
        continue;
    }
  }
}

const char* match(Match& m, const char* s, const char* p) {
  if (++m.depth > kMaxDepth) {
    --m.depth;
    return m.fail("pattern too complex (more than 200 nested repetitions or captures)");
  }
  const char* res = match_item(m, s, p);
  --m.depth;
  return res;
}

const PatternBudget* budget_of(lua_State* L) {
  return static_cast<const PatternBudget*>(lua_touserdata(L, lua_upvalueindex(1)));
}

// Raises what stopped the match; returns normally when nothing did. Plain C frames only
// lie between here and the Lua call: nothing is skipped by the error's unwinding.
void raise_if_stopped(Match& m) {
  if (m.stop == Stop::error) luaL_error(m.L, "%s", m.error);
  if (m.stop == Stop::budget) m.budget->raise(m.L);
}

// Matches at `s`; raises on a stop.
const char* match_at(Match& m, const char* s, const char* p) {
  m.level = 0;
  m.depth = 0;
  const char* e = match(m, s, p);
  raise_if_stopped(m);
  return e;
}

void push_capture(Match& m, int i, const char* s, const char* e) {
  if (i >= m.level) {
    if (i == 0) {
      lua_pushlstring(m.L, s, static_cast<size_t>(e - s));  // the whole match
      return;
    }
    luaL_error(m.L, "invalid capture index");
  }
  const ptrdiff_t len = m.capture[i].len;
  if (len == kUnfinished) luaL_error(m.L, "unfinished capture");
  if (len == kPosition)
    lua_pushinteger(m.L, m.capture[i].init - m.src_init + 1);
  else
    lua_pushlstring(m.L, m.capture[i].init, static_cast<size_t>(len));
}

int push_captures(Match& m, const char* s, const char* e, bool whole_if_none) {
  const int n = m.level == 0 && whole_if_none ? 1 : m.level;
  luaL_checkstack(m.L, n, "too many captures");
  for (int i = 0; i < n; ++i) push_capture(m, i, s, e);
  return n;
}

Match new_match(lua_State* L, const char* s, size_t len) {
  Match m{};
  m.L = L;
  m.budget = budget_of(L);
  m.src_init = s;
  m.src_end = s + len;
  return m;
}

// The plain search of string.find, charged per byte compared at worst.
const char* find_plain(Match& m, const char* s, size_t len, const char* p, size_t plen) {
  if (plen == 0) return s;
  if (plen > len) return nullptr;
  m.steps += static_cast<int64_t>(len);
  if (!m.step()) raise_if_stopped(m);
  const char* last = s + (len - plen);
  for (const char* at = s; at <= last; ++at) {
    at = static_cast<const char*>(std::memchr(at, p[0], static_cast<size_t>(last - at) + 1));
    if (!at) return nullptr;
    if (std::memcmp(at + 1, p + 1, plen - 1) == 0) return at;
  }
  return nullptr;
}

// string.find (find = true) and string.match.
int find_or_match(lua_State* L, bool find) {
  size_t len = 0, plen = 0;
  const char* s = luaL_checklstring(L, 1, &len);
  const char* p = luaL_checklstring(L, 2, &plen);
  ptrdiff_t init = static_cast<ptrdiff_t>(luaL_optinteger(L, 3, 1));
  if (init < 0) init += static_cast<ptrdiff_t>(len) + 1;  // from the end
  init = init <= 0 ? 0 : init - 1;
  if (init > static_cast<ptrdiff_t>(len)) init = static_cast<ptrdiff_t>(len);
  Match m = new_match(L, s, len);
  if (find && (lua_toboolean(L, 4) || std::strpbrk(p, "^$*+?.([%-") == nullptr)) {
    if (const char* at = find_plain(m, s + init, len - static_cast<size_t>(init), p, plen)) {
      lua_pushinteger(L, at - s + 1);
      lua_pushinteger(L, at - s + static_cast<ptrdiff_t>(plen));
      return 2;
    }
  } else {
    const bool anchored = *p == '^';
    if (anchored) ++p;
    const char* from = s + init;
    do {
      if (const char* e = match_at(m, from, p)) {
        if (!find) return push_captures(m, from, e, true);
        lua_pushinteger(L, from - s + 1);
        lua_pushinteger(L, e - s);
        return push_captures(m, nullptr, nullptr, false) + 2;
      }
    } while (from++ < m.src_end && !anchored);
  }
  lua_pushnil(L);
  return 1;
}

int str_find(lua_State* L) { return find_or_match(L, true); }
int str_match(lua_State* L) { return find_or_match(L, false); }

// The iterator of string.gmatch; upvalues: budget, subject, pattern, next position. As
// in Lua 5.1, '^' is not an anchor here.
int gmatch_next(lua_State* L) {
  size_t len = 0;
  const char* s = lua_tolstring(L, lua_upvalueindex(2), &len);
  const char* p = lua_tostring(L, lua_upvalueindex(3));
  Match m = new_match(L, s, len);
  for (const char* from = s + static_cast<ptrdiff_t>(lua_tointeger(L, lua_upvalueindex(4))); from <= m.src_end;
       ++from) {
    if (const char* e = match_at(m, from, p)) {
      const ptrdiff_t next = e - s + (e == from ? 1 : 0);  // an empty match moves on by one
      lua_pushinteger(L, next);
      lua_replace(L, lua_upvalueindex(4));
      return push_captures(m, from, e, true);
    }
  }
  return 0;
}

int str_gmatch(lua_State* L) {
  luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  lua_settop(L, 2);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_pushinteger(L, 0);
  lua_pushcclosure(L, gmatch_next, 4);
  return 1;
}

// The replacement of one match in string.gsub, added to b.
void add_replacement(Match& m, luaL_Buffer* b, const char* s, const char* e) {
  lua_State* L = m.L;
  switch (lua_type(L, 3)) {
    case LUA_TNUMBER:
    case LUA_TSTRING: {
      size_t len = 0;
      const char* r = lua_tolstring(L, 3, &len);
      for (size_t i = 0; i < len; ++i) {
        if (r[i] != '%' || i + 1 == len) {
          luaL_addchar(b, r[i]);
          continue;
        }
        const int c = uchar(r[++i]);
        if (!is_digit(c)) {
          luaL_addchar(b, static_cast<char>(c));  // "%%" and any other escaped character
        } else if (c == '0') {
          luaL_addlstring(b, s, static_cast<size_t>(e - s));
        } else {
          push_capture(m, c - '1', s, e);
          luaL_addvalue(b);
        }
      }
      return;
    }
    case LUA_TFUNCTION: {
      lua_pushvalue(L, 3);
      const int n = push_captures(m, s, e, true);
      lua_call(L, n, 1);
      break;
    }
    default: {  // a table, looked up with the first capture
      push_capture(m, 0, s, e);
      lua_gettable(L, 3);
      break;
    }
  }
  if (!lua_toboolean(L, -1)) {  // nil or false: the match stays as it was
    lua_pop(L, 1);
    lua_pushlstring(L, s, static_cast<size_t>(e - s));
  } else if (!lua_isstring(L, -1)) {
    luaL_error(L, "invalid replacement value (a %s)", luaL_typename(L, -1));
  }
  luaL_addvalue(b);
}

int str_gsub(lua_State* L) {
  size_t len = 0;
  const char* src = luaL_checklstring(L, 1, &len);
  const char* p = luaL_checkstring(L, 2);
  const int type = lua_type(L, 3);
  luaL_argcheck(L, type == LUA_TNUMBER || type == LUA_TSTRING || type == LUA_TFUNCTION || type == LUA_TTABLE, 3,
                "string/function/table expected");
  const lua_Integer max_n = luaL_optinteger(L, 4, static_cast<lua_Integer>(len) + 1);
  const bool anchored = *p == '^';
  if (anchored) ++p;
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  Match m = new_match(L, src, len);
  lua_Integer n = 0;
  while (n < max_n) {
    const char* e = match_at(m, src, p);
    if (e) {
      ++n;
      add_replacement(m, &b, src, e);
    }
    if (e && e > src)
      src = e;
    else if (src < m.src_end)
      luaL_addchar(&b, *src++);
    else
      break;
    if (anchored) break;
  }
  luaL_addlstring(&b, src, static_cast<size_t>(m.src_end - src));
  luaL_pushresult(&b);
  lua_pushinteger(L, n);
  return 2;
}

}  // namespace

void install_bounded_patterns(lua_State* L, const PatternBudget* budget) {
  lua_getglobal(L, "string");
  const luaL_Reg functions[] = {{"find", str_find}, {"match", str_match}, {"gmatch", str_gmatch}, {"gsub", str_gsub}};
  for (const luaL_Reg& f : functions) {
    lua_pushlightuserdata(L, const_cast<PatternBudget*>(budget));
    lua_pushcclosure(L, f.func, 1);
    lua_setfield(L, -2, f.name);
  }
  lua_pop(L, 1);
}

}  // namespace tide
