// The request-field rules that need no server: the refused-field table, prompt truncation and
// continue_final_message's cut, and the chat prompt options.
#include <gtest/gtest.h>

#include "server/http/api_error.h"
#include "server/http/chat_requests.h"
#include "server/http/refused_fields.h"
#include "server/http/vllm_request_fields.h"
#include "tests/cpp/server/http/expect_api_error.h"

namespace attnres::server::http {
namespace {

using Json = nlohmann::ordered_json;

TEST(RefusedFields, EachRefusedFieldIsA400NamingIt) {
  const std::pair<const char*, Json> cases[] = {
      {"use_beam_search", true},
      {"suffix", "x"},
      {"best_of", 3},
      {"guided_whitespace_pattern", " "},
      {"structural_tag", Json::parse(R"({"type": "structural_tag"})")},
      {"logits_processors", Json::array({"x"})},
      {"priority", 1},
      {"n_predict", 10},
  };
  for (const auto& [name, value] : cases) {
    Json body = {{"prompt", "hi"}};
    body[name] = value;
    const ApiError e =
        expect_api_error([&] { refuse_unsupported_fields(body, Endpoint::Completions); });
    EXPECT_EQ(e.status(), 400) << name;
    EXPECT_EQ(e.param(), name);
    EXPECT_NE(std::string(e.what()).find(std::string("field ") + name + ":"), std::string::npos)
        << e.what();
  }
}

TEST(RefusedFields, DefaultsAndNullsPass) {
  const Json body = Json::parse(R"({
      "prompt": "hi", "n": 2, "use_beam_search": false, "best_of": 2, "suffix": null,
      "priority": 0, "n_predict": -1,
      "typical_p": 1.0, "user": "u", "store": true, "metadata": {"a": "b"}})");
  EXPECT_NO_THROW(refuse_unsupported_fields(body, Endpoint::Completions));
  const Json chat = Json::parse(R"({
      "messages": [], "tool_choice": "auto", "parallel_tool_calls": true,
      "include_reasoning": true, "modalities": ["text"], "echo": false})");
  EXPECT_NO_THROW(refuse_unsupported_fields(chat, Endpoint::Chat));
}

TEST(RefusedFields, EndpointSpecificRows) {
  // suffix is a completions field; chat's echo is refused, completions' echo is honoured.
  EXPECT_NO_THROW(refuse_unsupported_fields({{"suffix", "x"}}, Endpoint::Chat));
  EXPECT_NO_THROW(refuse_unsupported_fields({{"echo", true}}, Endpoint::Completions));
  EXPECT_EQ(expect_api_error([] {
              refuse_unsupported_fields({{"echo", true}}, Endpoint::Chat);
            }).param(),
            "echo");
  // best_of is judged against n.
  EXPECT_EQ(expect_api_error([] {
              refuse_unsupported_fields({{"best_of", 2}}, Endpoint::Completions);
            }).param(),
            "best_of");
}

TEST(PromptTruncation, KeepsTheLastOrFirstTokens) {
  std::vector<int32_t> ids = {1, 2, 3, 4, 5};
  EXPECT_TRUE(truncate_prompt(ids, {3, true}, 10, 100));
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 4, 5}));
  ids = {1, 2, 3, 4, 5};
  EXPECT_TRUE(truncate_prompt(ids, {2, false}, 10, 100));
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2}));
  ids = {1, 2, 3};
  EXPECT_FALSE(truncate_prompt(ids, {5, true}, 10, 100));  // already short enough
  EXPECT_FALSE(truncate_prompt(ids, {}, 10, 100));         // not asked
  EXPECT_EQ(ids.size(), 3u);
}

TEST(PromptTruncation, MinusOneKeepsWhatFitsAndTooLargeIsA400) {
  std::vector<int32_t> ids(20, 7);
  EXPECT_TRUE(truncate_prompt(ids, {-1, true}, 6, 16));  // 16 - 6 = 10 fit
  EXPECT_EQ(ids.size(), 10u);
  const ApiError e = expect_api_error([&] { truncate_prompt(ids, {11, true}, 6, 16); });
  EXPECT_EQ(e.param(), "truncate_prompt_tokens");
}

TEST(ContinueFinalMessage, CutsRightAfterTheFinalMessage) {
  const Json messages = Json::parse(
      R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, I"}])");
  EXPECT_EQ(cut_after_final_message("<u>Hi</u><a>Hello, I</a>\n", messages),
            "<u>Hi</u><a>Hello, I");
  // A template that strips the text: cut after the stripped text.
  const Json spaced = Json::parse(R"([{"role": "assistant", "content": " Hello "}])");
  EXPECT_EQ(cut_after_final_message("<a>Hello</a>", spaced), "<a>Hello");
  // Trailing whitespace the template kept is kept.
  const Json trailing = Json::parse(R"([{"role": "assistant", "content": "Hello "}])");
  EXPECT_EQ(cut_after_final_message("<a>Hello </a>", trailing), "<a>Hello ");
  const Json missing = Json::parse(R"([{"role": "assistant", "content": "Bye"}])");
  EXPECT_EQ(expect_api_error([&] { cut_after_final_message("<a>Hello</a>", missing); }).param(),
            "continue_final_message");
}

TEST(ChatPromptOptions, ContinueFinalMessageRules) {
  const Json alone = {{"continue_final_message", true}};
  const ChatPromptOptions o = read_chat_prompt_options(FieldReader(alone));
  EXPECT_TRUE(o.continue_final_message);
  EXPECT_FALSE(o.add_generation_prompt);
  const Json both = {{"continue_final_message", true}, {"add_generation_prompt", true}};
  EXPECT_EQ(expect_api_error([&] { read_chat_prompt_options(FieldReader(both)); }).param(),
            "continue_final_message");
  const Json bad_template = {{"chat_template", "{% for m in messages %}"}};
  EXPECT_EQ(expect_api_error([&] { read_chat_prompt_options(FieldReader(bad_template)); }).param(),
            "chat_template");
}

}  // namespace
}  // namespace attnres::server::http
