// engine -> proto: chunks, completions (usage, stop reason, logprobs) and model info.
#include "server/grpc/grpc_responses.h"

#include <gtest/gtest.h>

#include <cmath>

namespace attnres::server {
namespace {

RequestOutput output(int choice, std::vector<int32_t> ids, std::string text) {
  RequestOutput out;
  out.choice_index = choice;
  out.token_ids = std::move(ids);
  out.text = std::move(text);
  for (int32_t id : out.token_ids) {
    out.logprobs.push_back(TokenLogprob{id, -0.5f, 1, {{id, -0.5f}}});
  }
  return out;
}

TEST(GrpcResponses, ChunkCarriesTheDelta) {
  const v1::GenerateStreamChunk chunk = make_chunk(output(2, {5, 6}, "ab"), true);
  EXPECT_EQ(chunk.index(), 2u);
  EXPECT_EQ(chunk.token_ids_size(), 2);
  EXPECT_EQ(chunk.text(), "ab");
  ASSERT_EQ(chunk.logprobs_size(), 2);
  EXPECT_EQ(chunk.logprobs(1).token_id(), 6);
  EXPECT_EQ(chunk.logprobs(1).top_logprobs_size(), 1);
  EXPECT_EQ(make_chunk(output(0, {5}, "a"), false).text(), "");
}

TEST(GrpcResponses, CompleteSumsTheChoice) {
  ChoiceResult choice;
  choice.add(output(1, {5, 6}, "ab"));
  RequestOutput last = output(1, {7}, "c");
  last.finish_reason = FinishReason::Stop;
  last.stop_string = "xy";
  choice.add(last);
  const v1::GenerateComplete complete = make_complete(last, choice, 10, true, false);
  EXPECT_EQ(complete.index(), 1u);
  EXPECT_EQ(complete.finish_reason(), "stop");
  EXPECT_EQ(complete.output_ids_size(), 3);
  EXPECT_EQ(complete.text(), "abc");
  EXPECT_EQ(complete.stop_string(), "xy");
  EXPECT_EQ(complete.usage().prompt_tokens(), 10u);
  EXPECT_EQ(complete.usage().completion_tokens(), 3u);
  EXPECT_EQ(complete.usage().total_tokens(), 13u);
  EXPECT_EQ(complete.logprobs_size(), 3);
  // Streamed: the chunks already carried the logprobs.
  EXPECT_EQ(make_complete(last, choice, 10, true, true).logprobs_size(), 0);
}

TEST(GrpcResponses, DepthAttentionMatrices) {
  const float nan = kDepthAttentionUnused;
  DepthAttentionLayout layout{{"layer 0 attention", "final"}, {"embedding", "block 1"}, {2, 2}};
  RequestOutput first;
  first.token_ids = {4};
  first.depth_prompt_mean = DepthAttentionMatrix{2, 2, {0.25f, 0.75f, 1.0f, nan}};
  first.depth_per_token = {DepthAttentionMatrix{2, 2, {0.5f, 0.5f, 0.1f, 0.9f}}};
  RequestOutput last;
  last.token_ids = {6};
  last.depth_per_token = {DepthAttentionMatrix{2, 2, {0.2f, 0.8f, 0.3f, 0.7f}}};
  last.finish_reason = FinishReason::Length;
  ChoiceResult choice;
  choice.add(first);
  choice.add(last);

  const v1::GenerateStreamChunk chunk = make_chunk(last, true);
  ASSERT_EQ(chunk.depth_attention_size(), 1);
  EXPECT_EQ(chunk.depth_attention(0).rows(), 2u);
  EXPECT_FLOAT_EQ(chunk.depth_attention(0).values(3), 0.7f);

  const v1::GenerateComplete whole = make_complete(last, choice, 3, true, false, &layout);
  ASSERT_TRUE(whole.has_depth_attention());
  EXPECT_EQ(whole.depth_attention().sublayers(1), "final");
  EXPECT_EQ(whole.depth_attention().sources(1), "block 1");
  EXPECT_FLOAT_EQ(whole.depth_attention().prompt_mean().values(1), 0.75f);
  EXPECT_TRUE(std::isnan(whole.depth_attention().prompt_mean().values(3)));
  ASSERT_EQ(whole.depth_attention().per_token_size(), 2);
  EXPECT_FLOAT_EQ(whole.depth_attention().per_token(1).values(0), 0.2f);

  // Streamed: the chunks carried the per-token matrices; not asked: nothing.
  EXPECT_EQ(make_complete(last, choice, 3, true, true, &layout).depth_attention().per_token_size(),
            0);
  EXPECT_FALSE(make_complete(last, choice, 3, true, false).has_depth_attention());
}

}  // namespace
}  // namespace attnres::server
