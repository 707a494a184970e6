// The pieces of server/http that need no server: field reading, error envelopes, the
// context-length message and SSE framing.
#include <gtest/gtest.h>

#include "server/http/api_error.h"
#include "server/http/field_reader.h"
#include "server/http/openai_requests.h"
#include "server/http/sse_stream.h"
#include "tests/cpp/server/http/expect_api_error.h"

namespace attnres::server::http {
namespace {

using Json = nlohmann::ordered_json;

// Runs `fn`, expecting a JsonFieldError (the router answers it with a 400 naming field()).
template <typename Fn>
JsonFieldError expect_field_error(Fn fn) {
  try {
    fn();
  } catch (const JsonFieldError& e) {
    return e;
  }
  ADD_FAILURE() << "no JsonFieldError thrown";
  return JsonFieldError("", "");
}

TEST(FieldReader, AbsentAndNullReadAsNotGiven) {
  const Json body = Json::parse(R"({"a": null})");
  FieldReader f(body);
  EXPECT_FALSE(f.number("a", 0, 1).has_value());
  EXPECT_FALSE(f.integer("missing", 0, 1).has_value());
}

TEST(FieldReader, WrongTypeNamesTheField) {
  const Json body = Json::parse(R"({"max_tokens": "ten", "temperature": "hot", "n": true})");
  FieldReader f(body);
  JsonFieldError e = expect_field_error([&] { f.integer("max_tokens", 1, 100); });
  EXPECT_EQ(e.field(), "max_tokens");
  EXPECT_STREQ(e.what(), "field max_tokens: expected an integer, got the string \"ten\"");
  EXPECT_EQ(expect_field_error([&] { f.number("temperature", 0, 2); }).field(), "temperature");
  EXPECT_EQ(expect_field_error([&] { f.integer("n", 1, 8); }).field(), "n");  // bool is no int
}

TEST(FieldReader, RangesAndIntegralFloats) {
  const Json body = Json::parse(R"({"n": 3.0, "m": 3.5, "t": -1, "big": 18446744073709551615})");
  FieldReader f(body);
  EXPECT_EQ(f.integer("n", 1, 8), 3);
  EXPECT_EQ(expect_field_error([&] { f.integer("m", 1, 8); }).field(), "m");
  EXPECT_EQ(expect_field_error([&] { f.number("t", 0, 2); }).field(), "t");
  EXPECT_EQ(expect_field_error([&] { f.integer("big", INT64_MIN, INT64_MAX); }).field(), "big");
}

TEST(FieldReader, StringOrListAndIntList) {
  const Json body = Json::parse(R"({"s": "x", "l": ["a", "b"], "bad": ["a", 1], "ids": [1, 2]})");
  FieldReader f(body);
  EXPECT_EQ(f.string_or_list("s"), (std::vector<std::string>{"x"}));
  EXPECT_EQ(f.string_or_list("l"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(expect_field_error([&] { f.string_or_list("bad"); }).field(), "bad");
  EXPECT_EQ(f.int_list("ids"), (std::vector<int32_t>{1, 2}));
}

TEST(FieldReader, BodyMustBeAnObject) {
  const Json body = Json::parse("[1, 2]");
  EXPECT_EQ(expect_api_error([&] { FieldReader f(body); }).status(), 400);
}

TEST(ApiErrors, EnvelopeShape) {
  const Json body = error_body(404, "no such model", "model", "model_not_found");
  EXPECT_EQ(dump_json(body),
            R"({"error":{"message":"no such model","type":"invalid_request_error",)"
            R"("param":"model","code":"model_not_found"}})");
  const Json bare = error_body(500, "boom");
  EXPECT_TRUE(bare["error"]["param"].is_null());
  EXPECT_TRUE(bare["error"]["code"].is_null());
  EXPECT_EQ(bare["error"]["type"], "server_error");
}

TEST(ApiErrors, FieldNamedInEngineMessages) {
  EXPECT_EQ(field_named_in("field top_p: got 0, expected a number in (0, 1]"), "top_p");
  EXPECT_EQ(field_named_in("field logit_bias[5]: got 1000, expected ..."), "logit_bias");
  EXPECT_EQ(field_named_in("n: got 0, expected 1 to 128"), "n");
  EXPECT_EQ(field_named_in("This model's maximum context length is 5: ..."), "");
}

TEST(ApiErrors, DumpReplacesInvalidUtf8) {
  Json j;
  j["text"] = std::string(
      "a\xff"
      "b");
  EXPECT_EQ(dump_json(j),
            "{\"text\":\"a\xEF\xBF\xBD"
            "b\"}");
}

TEST(ContextLength, MessageHasBothNumbers) {
  ApiError e = expect_api_error([] { check_context_length(200, 100, 256, "prompt"); });
  const std::string message = e.what();
  EXPECT_EQ(e.status(), 400);
  for (const char* number : {"256", "300", "200", "100"}) {
    EXPECT_NE(message.find(number), std::string::npos) << number << " in " << message;
  }
  ApiError alone = expect_api_error([] { check_context_length(300, 0, 256, "messages"); });
  EXPECT_NE(std::string(alone.what()).find("300"), std::string::npos);
  EXPECT_EQ(alone.param(), "messages");
  check_context_length(200, 56, 256, "prompt");  // exactly full is fine
}

TEST(Sse, FramingIsExact) {
  Json j;
  j["a"] = "line\nbreak";
  EXPECT_EQ(sse_event(j), "data: {\"a\":\"line\\nbreak\"}\n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
  std::string wire;
  SseWriter writer(wire);
  writer.event(j);
  writer.error(j);
  EXPECT_EQ(wire, sse_event(j) + sse_event(j) + std::string(kSseDone));
}

}  // namespace
}  // namespace attnres::server::http
