// The one typed JSON field reader: what it accepts, what it refuses, and the one message
// style ("[<origin>: ]field NAME: ...") with the field at fault on the error.
#include "engine/core/json_fields.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace attnres {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

template <typename Fn>
JsonFieldError field_error(Fn fn) {
  try {
    fn();
  } catch (const JsonFieldError& e) {
    return e;
  }
  ADD_FAILURE() << "no JsonFieldError thrown";
  return JsonFieldError("", "");
}

TEST(JsonFields, AbsentAndNullAreNotGiven) {
  const json object = json::parse(R"({"a": null})");
  const JsonFields<json> f(object);
  EXPECT_EQ(f.find("a"), nullptr);
  EXPECT_FALSE(f.has("missing"));
  EXPECT_FALSE(f.integer("a", 0, 1));
  EXPECT_FALSE(f.number("a"));
  EXPECT_FALSE(f.boolean("a"));
  EXPECT_FALSE(f.string("a"));
  EXPECT_FALSE(f.token_id("a"));
  EXPECT_TRUE(f.token_ids("a").empty());
  const json not_an_object = json::array();
  EXPECT_EQ(JsonFields<json>(not_an_object).find("a"), nullptr);
}

TEST(JsonFields, MessagesNameTheOriginAndTheField) {
  const json object = json::parse(R"({"hidden_size": "8", "head_dim": 4.5, "n": 0})");
  const JsonFields<json> f(object, JsonFieldOptions::with_origin("dir/config.json"));
  JsonFieldError e = field_error([&] { f.integer("hidden_size", 1, 10); });
  EXPECT_STREQ(e.what(),
               "dir/config.json: field hidden_size: expected an integer, got the string \"8\"");
  EXPECT_EQ(e.field(), "hidden_size");
  EXPECT_STREQ(field_error([&] { f.integer("head_dim", 1, 10); }).what(),
               "dir/config.json: field head_dim: expected an integer, got the number 4.5");
  EXPECT_STREQ(field_error([&] { f.integer("n", 1, 10); }).what(),
               "dir/config.json: field n: got 0, expected a value in [1, 10]");
  EXPECT_STREQ(field_error([&] { f.fail("x", "missing"); }).what(),
               "dir/config.json: field x: missing");
}

TEST(JsonFields, IntegralFloatsOnlyWhenAsked) {
  const ordered_json object = ordered_json::parse(R"({"n": 3.0, "m": 3.5, "b": true})");
  EXPECT_THROW(JsonFields<ordered_json>(object).integer("n", 0, 10), JsonFieldError);
  JsonFieldOptions lenient;
  lenient.integral_floats = true;
  const JsonFields<ordered_json> f(object, lenient);
  EXPECT_EQ(f.integer("n", 0, 10), 3);
  EXPECT_EQ(field_error([&] { f.integer("m", 0, 10); }).field(), "m");
  EXPECT_EQ(field_error([&] { f.integer("b", 0, 10); }).field(), "b");  // a bool is no integer
}

TEST(JsonFields, IntegersBeyondInt64AreOutOfRange) {
  const json object = json::parse(R"({"big": 18446744073709551615})");
  EXPECT_STREQ(field_error([&] { JsonFields<json>(object).integer("big", 0, 5); }).what(),
               "field big: got 18446744073709551615, expected a value in [0, 5]");
}

TEST(JsonFields, NumberRanges) {
  const json object = json::parse(R"({"zero": 0, "half": 0.5, "two": 2, "s": "hot"})");
  const JsonFields<json> f(object);
  EXPECT_EQ(f.number("half", {0, 1, /*lo_open=*/true}), 0.5);
  EXPECT_EQ(f.number("zero", NumberRange::non_negative()), 0.0);
  EXPECT_STREQ(field_error([&] { f.number("zero", NumberRange::positive()); }).what(),
               "field zero: got 0, expected a value > 0");
  EXPECT_STREQ(field_error([&] {
                 f.number("two", {0, 1, true});
               }).what(),
               "field two: got 2, expected a value in (0, 1]");
  EXPECT_STREQ(field_error([&] { f.number("s"); }).what(),
               "field s: expected a number, got the string \"hot\"");
}

TEST(JsonFields, BooleansAndStrings) {
  const json object = json::parse(R"({"t": true, "one": 1, "s": "x", "seven": 7})");
  const JsonFields<json> f(object);
  EXPECT_EQ(f.boolean("t"), true);
  EXPECT_STREQ(field_error([&] { f.boolean("one"); }).what(),
               "field one: expected true or false, got the number 1");
  EXPECT_EQ(f.string("s"), "x");
  EXPECT_STREQ(field_error([&] { f.string("seven"); }).what(),
               "field seven: expected a string, got the number 7");
}

TEST(JsonFields, ListsNameTheItem) {
  const ordered_json object =
      ordered_json::parse(R"({"s": "x", "l": ["a", "b"], "bad": ["a", 1], "ids": [1, -2],
                              "wide": [1, 4294967296]})");
  const JsonFields<ordered_json> f(object);
  EXPECT_EQ(f.string_or_list("s"), (std::vector<std::string>{"x"}));
  EXPECT_EQ(f.string_or_list("l"), (std::vector<std::string>{"a", "b"}));
  JsonFieldError e = field_error([&] { f.string_or_list("bad"); });
  EXPECT_STREQ(e.what(), "field bad[1]: expected a string, got the number 1");
  EXPECT_EQ(e.field(), "bad");
  EXPECT_EQ(f.int_list("ids"), (std::vector<int32_t>{1, -2}));
  EXPECT_EQ(field_error([&] { f.int_list("wide"); }).field(), "wide");
}

TEST(JsonFields, TokenIds) {
  const json object = json::parse(R"({"one": 2, "list": [1, 2], "neg": -1, "bad": [1, "two"]})");
  const JsonFields<json> f(object);
  EXPECT_EQ(f.token_id("one"), 2);
  EXPECT_EQ(f.token_ids("one"), (std::vector<int32_t>{2}));
  EXPECT_EQ(f.token_ids("list"), (std::vector<int32_t>{1, 2}));
  EXPECT_STREQ(field_error([&] { f.token_id("neg"); }).what(),
               "field neg: got -1, expected a value in [0, 2147483647]");
  EXPECT_STREQ(field_error([&] { f.token_ids("bad"); }).what(),
               "field bad[1]: expected a token id, got the string \"two\"");
}

TEST(JsonFields, NestedNamesGiveTheTopLevelField) {
  const ordered_json item = ordered_json::parse(R"({"role": 7})");
  JsonFieldError e =
      field_error([&] { json_wrong_type(item["role"], "messages[2].role", "a string"); });
  EXPECT_STREQ(e.what(), "field messages[2].role: expected a string, got the number 7");
  EXPECT_EQ(e.field(), "messages");
}

}  // namespace
}  // namespace attnres
