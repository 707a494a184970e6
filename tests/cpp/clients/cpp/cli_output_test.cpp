// What attnres-client prints: the --json documents (OpenAI / vLLM field names, stop_reason
// from a stop string or stop token, logprobs only when present), the stderr summary line,
// model-info text and the id lists that --prompt-ids reads back.
#include <gtest/gtest.h>

#include "clients/cpp/cli/cli_output.h"

namespace attnres::client::cli {
namespace {

GenerateResult two_choices() {
  GenerateResult result;
  result.request_id = "req-7";
  Choice a;
  a.index = 0;
  a.text = "Hello";
  a.token_ids = {1, 2};
  a.finish_reason = "stop";
  a.stop_string = "\n\"x";
  a.usage = {4, 2, 6};
  a.logprobs = {{1, -0.5f, 1, {{1, -0.5f}, {9, -1.5f}}}, {2, -0.25f, 1, {{2, -0.25f}}}};
  Choice b;
  b.index = 1;
  b.text = "Bye";
  b.token_ids = {3};
  b.finish_reason = "stop";
  b.stop_token_id = 50256;
  b.usage = {4, 1, 5};
  b.error = "engine failed";
  result.choices = {a, b};
  result.usage = {4, 3, 7};
  return result;
}

TEST(CliOutput, GenerateResultJson) {
  const nlohmann::json j = to_json(two_choices());
  EXPECT_EQ(j["request_id"], "req-7");
  EXPECT_EQ(j["usage"], nlohmann::json::parse(
                            R"({"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7})"));
  ASSERT_EQ(j["choices"].size(), 2u);
  const nlohmann::json& a = j["choices"][0];
  EXPECT_EQ(a["index"], 0);
  EXPECT_EQ(a["text"], "Hello");
  EXPECT_EQ(a["token_ids"], nlohmann::json::parse("[1, 2]"));
  EXPECT_EQ(a["finish_reason"], "stop");
  EXPECT_EQ(a["stop_reason"], "\n\"x");
  EXPECT_EQ(a["usage"]["total_tokens"], 6);
  EXPECT_FALSE(a.contains("error"));
  EXPECT_EQ(a["logprobs"], nlohmann::json::parse(R"([
      {"token_id": 1, "logprob": -0.5, "rank": 1,
       "top": [{"token_id": 1, "logprob": -0.5}, {"token_id": 9, "logprob": -1.5}]},
      {"token_id": 2, "logprob": -0.25, "rank": 1, "top": [{"token_id": 2, "logprob": -0.25}]}
  ])"));
  const nlohmann::json& b = j["choices"][1];
  EXPECT_EQ(b["stop_reason"], 50256);
  EXPECT_FALSE(b.contains("logprobs"));
  EXPECT_EQ(b["error"], "engine failed");
  // A length / EOS finish has a null stop_reason, as vLLM sends it.
  GenerateResult plain = two_choices();
  plain.choices[0].stop_string.reset();
  EXPECT_TRUE(to_json(plain)["choices"][0]["stop_reason"].is_null());
}

TEST(CliOutput, SummaryLine) {
  EXPECT_EQ(summary_line(two_choices()),
            "[request req-7 | choice 0: finish_reason stop (stop \"\\n\\\"x\") | choice 1: "
            "finish_reason stop (stop token 50256) (error: engine failed) | usage: prompt 4, "
            "completion 3, total 7]");
  GenerateResult one = two_choices();
  one.choices.resize(1);
  one.choices[0].stop_string.reset();
  one.choices[0].finish_reason = "length";
  EXPECT_EQ(summary_line(one),
            "[request req-7 | finish_reason length | usage: prompt 4, completion 3, total 7]");
}

TEST(CliOutput, ModelInfo) {
  ModelInfo info;
  info.served_model_name = "demo";
  info.max_model_len = 2048;
  info.eos_token_ids = {50256};
  const nlohmann::json j = to_json(info);
  EXPECT_EQ(j["served_model_name"], "demo");
  EXPECT_EQ(j["max_model_len"], 2048);
  EXPECT_TRUE(j["bos_token_id"].is_null());
  info.bos_token_id = 0;
  EXPECT_EQ(to_json(info)["bos_token_id"], 0);
  const std::string text = model_info_text(info);
  EXPECT_NE(text.find("served_model_name: demo\n"), std::string::npos) << text;
  EXPECT_NE(text.find("max_model_len: 2048\n"), std::string::npos) << text;
  EXPECT_NE(text.find("eos_token_ids: [50256]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("bos_token_id: 0\n"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 11);  // one line per field
}

TEST(CliOutput, TokenizeAndIds) {
  EXPECT_EQ(join_ids({}), "");
  EXPECT_EQ(join_ids({7}), "7");
  EXPECT_EQ(join_ids({1, 22, 333}), "1,22,333");
  EXPECT_EQ(dump(to_json(TokenizeResult{{5, 6}, 4096})),
            R"({"count":2,"max_model_len":4096,"token_ids":[5,6]})");
}

TEST(CliOutput, DumpReplacesInvalidUtf8) {
  EXPECT_EQ(dump(nlohmann::json{{"text", std::string("a\xff")}}), "{\"text\":\"a\xEF\xBF\xBD\"}");
}

}  // namespace
}  // namespace attnres::client::cli
