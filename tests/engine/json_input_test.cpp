// JSON from outside the process: nesting is bounded before parsing, errors name the document.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tide/engine/io/json_input.h"
#include "tide/engine/io/utf8.h"

namespace tide {
namespace {

std::string nested(int depth, char open = '[', char close = ']') {
  return std::string(static_cast<size_t>(depth), open) + std::string(static_cast<size_t>(depth), close);
}

TEST(JsonInput, CountsNestingThroughStringsAndEscapes) {
  EXPECT_EQ(json_nesting_depth("1"), 0);
  EXPECT_EQ(json_nesting_depth(R"({"a": [1, {"b": []}]})"), 4);
  // Brackets inside strings, and an escaped quote that does not end the string.
  EXPECT_EQ(json_nesting_depth(R"(["[[[{{{", "\"[[[", "\\"])"), 1);
  EXPECT_EQ(json_nesting_depth(nested(100000), 64), 65);  // stops counting past the limit
}

TEST(JsonInput, RefusesDeepNestingBeforeParsing) {
  // 100,000 levels: parsed, then copied or dumped, this would overflow the stack.
  try {
    parse_json_input(nested(100000), "request");
    FAIL() << "accepted 100000 levels";
  } catch (const JsonInputError& e) {
    EXPECT_STREQ(e.what(), "request: JSON nested more than 64 levels deep");
  }
  std::string objects;
  for (int i = 0; i < 70; ++i) objects += R"({"a":)";
  objects += "1" + std::string(70, '}');
  EXPECT_THROW(parse_json_input(objects, "body"), JsonInputError);
  EXPECT_TRUE(parse_json_or_discard(objects).is_discarded());
  // The limit itself is fine.
  EXPECT_EQ(parse_json_input(nested(kMaxJsonDepth), "x").dump(), nested(kMaxJsonDepth));
}

TEST(JsonInput, NamesTheDocumentAndThePlaceOfASyntaxError) {
  try {
    parse_json_input("{\"a\": 1,\n \"b\": }", "config.json");
    FAIL();
  } catch (const JsonInputError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("config.json: not valid JSON (parse error at line 2", 0), 0u) << m;
    EXPECT_EQ(m.find("[json.exception"), std::string::npos) << m;
  }
  EXPECT_TRUE(parse_json_or_discard("{oops").is_discarded());
}

TEST(JsonInput, ANumberBeyondADoubleIsAnInputErrorNamingTheDocument) {
  // nlohmann reports it as out_of_range, not parse_error (found by tests/fuzz).
  try {
    parse_json_input(R"({"v": 1, "id": 22e222111})", "frame");
    FAIL();
  } catch (const JsonInputError& e) {
    EXPECT_EQ(std::string(e.what()).rfind("frame: not valid JSON (number overflow", 0), 0u) << e.what();
  }
}

TEST(JsonInput, FindsTheFirstByteThatIsNotUtf8) {
  EXPECT_EQ(first_non_utf8("plain ASCII, caf\xC3\xA9, \xE2\x82\xAC, \xF0\x9F\x99\x82"), std::string_view::npos);
  EXPECT_EQ(first_non_utf8("ab\x9A"), 2u);            // a lone continuation byte
  EXPECT_EQ(first_non_utf8("\xC0\xAF"), 0u);          // an overlong '/'
  EXPECT_EQ(first_non_utf8("x\xED\xA0\x80"), 1u);     // a surrogate
  EXPECT_EQ(first_non_utf8("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(first_non_utf8("ok\xE2\x82"), 2u);        // cut short
}

TEST(JsonInput, ReadsFilesAndNamesThem) {
  const auto dir = std::filesystem::temp_directory_path() / ("tide-json-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "manifest.json").string();
  std::ofstream(path) << R"({"format": 1})";
  EXPECT_EQ(read_json_file(path)["format"], 1);
  std::ofstream(path, std::ios::trunc) << nested(1000);
  try {
    read_json_file(path);
    FAIL();
  } catch (const JsonInputError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  EXPECT_THROW(read_json_file(path, 10), JsonInputError);  // larger than allowed
  EXPECT_THROW(read_json_file((dir / "absent.json").string()), JsonInputError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tide
