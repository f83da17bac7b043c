#include <gtest/gtest.h>

#include "tide/ipc/protocol.h"

namespace tide::ipc {
namespace {
using json = nlohmann::json;

ErrorCode refusal(const std::string& frame, json* id = nullptr) {
  json got;
  try {
    parse_request(frame, got);
  } catch (const ProtocolError& e) {
    if (id) *id = got;
    return e.code();
  }
  ADD_FAILURE() << "accepted: " << frame;
  return ErrorCode::internal;
}

TEST(Protocol, ParsesAnEnvelope) {
  json id;
  const Request r = parse_request(R"({"v":1,"id":"c-7","type":"status","body":{"run":"x-1"}})", id);
  EXPECT_EQ(r.type, "status");
  EXPECT_EQ(r.id, "c-7");
  EXPECT_EQ(r.body["run"], "x-1");
  EXPECT_TRUE(parse_request(R"({"v":1,"type":"info"})", id).body.is_object());  // body optional
}

TEST(Protocol, RefusesMalformedRequestsWithTheRightCode) {
  EXPECT_EQ(refusal("{nope"), ErrorCode::bad_request);
  EXPECT_EQ(refusal("[]"), ErrorCode::bad_request);
  EXPECT_EQ(refusal(R"({"id":1,"type":"info"})"), ErrorCode::bad_request);         // no version
  EXPECT_EQ(refusal(R"({"v":"1","type":"info"})"), ErrorCode::bad_request);        // version not an integer
  EXPECT_EQ(refusal(R"({"v":2,"type":"info"})"), ErrorCode::unsupported_version);
  EXPECT_EQ(refusal(R"({"v":1,"type":7})"), ErrorCode::bad_request);
  EXPECT_EQ(refusal(R"({"v":1,"type":"info","body":[1]})"), ErrorCode::bad_request);
  EXPECT_EQ(refusal(std::string(kRequestLimit + 1, ' ')), ErrorCode::too_large);
  json id;
  EXPECT_EQ(refusal(R"({"v":9,"id":42,"type":"info"})", &id), ErrorCode::unsupported_version);
  EXPECT_EQ(id, 42) << "the id is kept for the error reply";
}

TEST(Protocol, ErrorNamesAndNumbersAreStable) {
  // The C API and the bindings carry these numbers: never renumber.
  EXPECT_EQ(static_cast<int>(ErrorCode::bad_request), 1);
  EXPECT_EQ(static_cast<int>(ErrorCode::internal), 11);
  for (int n = 1; n <= 11; ++n) {
    const auto code = static_cast<ErrorCode>(n);
    EXPECT_EQ(error_from_name(error_name(code)), code) << n;
  }
  const json reply = json::parse(reply_error(3, ErrorCode::not_found, "no run 'x'"));
  EXPECT_EQ(reply["ok"], false);
  EXPECT_EQ(reply["error"]["code"], "not_found");
  EXPECT_EQ(reply["error"]["number"], 4);
  EXPECT_EQ(reply["id"], 3);
}

TEST(Protocol, BodyFieldsAreTyped) {
  const json body = {{"run", "a"}, {"n", 5}, {"s", 1}};
  EXPECT_EQ(require_string(body, "run"), "a");
  EXPECT_EQ(optional_int(body, "n", 0, 0, 10), 5);
  EXPECT_EQ(optional_int(body, "missing", 7, 0, 10), 7);
  EXPECT_THROW(optional_int(body, "n", 0, 0, 4), ProtocolError);
  EXPECT_THROW(require_string(body, "s"), ProtocolError);
  EXPECT_THROW(require_string(body, "absent"), ProtocolError);
}

TEST(Protocol, SafeNames) {
  EXPECT_TRUE(is_safe_name("llama-tiny-3"));
  EXPECT_TRUE(is_safe_name("a.b_c"));
  EXPECT_FALSE(is_safe_name(""));
  EXPECT_FALSE(is_safe_name("../etc"));
  EXPECT_FALSE(is_safe_name("a b"));
  EXPECT_FALSE(is_safe_name(std::string(65, 'a')));
}

}  // namespace
}  // namespace tide::ipc
