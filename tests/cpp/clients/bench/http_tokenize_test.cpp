// The /tokenize and /detokenize bodies `bench serve` exchanges: one request that both vLLM's
// (and attnres's) and llama.cpp's llama-server read, and replies read in either form (sample
// replies as each server writes them).
#include <gtest/gtest.h>

#include "clients/bench/http_backend.h"
#include "engine/core/error.h"

namespace attnres::bench {
namespace {

using Json = nlohmann::ordered_json;

TEST(HttpTokenize, RequestNamesTheTextBothWays) {
  const Json body = tokenize_request("m", "hello world", true);
  EXPECT_EQ(body["model"], "m");
  EXPECT_EQ(body["prompt"], "hello world");  // vLLM / attnres
  EXPECT_EQ(body["add_special_tokens"], true);
  EXPECT_EQ(body["content"], "hello world");  // llama-server
  EXPECT_EQ(body["add_special"], true);
  EXPECT_EQ(tokenize_request("m", "x", false)["add_special"], false);
}

TEST(HttpTokenize, ReadsVllmReplies) {
  const Json reply = Json::parse(R"({"count": 3, "max_model_len": 4096, "tokens": [9, 8, 7]})");
  EXPECT_EQ(tokenize_reply_count(reply), 3);
  EXPECT_EQ(tokenize_reply_tokens(reply), (std::vector<int32_t>{9, 8, 7}));
  EXPECT_EQ(detokenize_reply_text(Json::parse(R"({"prompt": "hi"})")), "hi");
}

TEST(HttpTokenize, ReadsLlamaServerReplies) {
  const Json reply = Json::parse(R"({"tokens": [151643, 42]})");
  EXPECT_EQ(tokenize_reply_count(reply), 2);
  EXPECT_EQ(tokenize_reply_tokens(reply), (std::vector<int32_t>{151643, 42}));
  EXPECT_EQ(detokenize_reply_text(Json::parse(R"({"content": "hi"})")), "hi");
}

TEST(HttpTokenize, RejectsRepliesInNeitherForm) {
  EXPECT_THROW(tokenize_reply_count(Json::parse(R"({"n": 2})")), Error);
  EXPECT_THROW(tokenize_reply_tokens(Json::parse(R"({"count": 2})")), Error);
  EXPECT_THROW(detokenize_reply_text(Json::parse(R"({"text": "hi"})")), Error);
}

}  // namespace
}  // namespace attnres::bench
