// engine -> proto: chunks, completions (usage, stop reason, logprobs) and model info.
#include "server/grpc/grpc_responses.h"

#include <gtest/gtest.h>

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
  ChoiceAccumulator choice;
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

}  // namespace
}  // namespace attnres::server
