// The offline generator (attnres generate, bench latency) steps the server's EngineCore: its
// tokens are the reference's, its schedule is the scheduler's chunked prefill, and its timings
// split the steps that computed prompt tokens from those that only decoded.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/sched/offline_generator.h"
#include "engine_test_util.h"

namespace attnres::testing {
namespace {

OfflineGeneratorOptions options_with_budget(int max_prefill_tokens) {
  OfflineGeneratorOptions options;
  options.num_kv_blocks = 64;
  options.block_size = 4;
  options.max_model_len = 64;
  options.max_prefill_tokens = max_prefill_tokens;
  return options;
}

std::vector<GenerationRequest> greedy_requests(int count, int prompt_len, int max_tokens) {
  std::vector<GenerationRequest> requests(count);
  for (int i = 0; i < count; ++i) {
    requests[i].prompt_ids = iota_prompt(prompt_len, 1 + 7 * i);
    requests[i].params.temperature = 0.0f;
    requests[i].params.max_tokens = max_tokens;
    requests[i].params.logprobs = 1;
  }
  return requests;
}

TEST(OfflineGenerator, GivesTheReferenceTokensAndOneLogprobPerToken) {
  FakeRunner runner(64, 4);
  OfflineGenerator generator(runner, nullptr, {kEos}, options_with_budget(8192));
  const auto requests = greedy_requests(3, 6, 5);
  const std::vector<GenerationResult> results = generator.generate(requests);
  ASSERT_EQ(results.size(), 3u);
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].token_ids, reference_tokens(requests[i].prompt_ids, 5)) << i;
    EXPECT_EQ(results[i].finish_reason, FinishReason::Length);
    ASSERT_EQ(results[i].logprobs.size(), results[i].token_ids.size());
    for (size_t k = 0; k < results[i].token_ids.size(); ++k) {
      EXPECT_EQ(results[i].logprobs[k].token_id, results[i].token_ids[k]);
    }
    EXPECT_TRUE(results[i].error.empty());
  }
}

TEST(OfflineGenerator, AllPromptsInOneStepWhenTheyFitThenOneStepPerToken) {
  FakeRunner runner(64, 4);
  OfflineGenerator generator(runner, nullptr, {kEos}, options_with_budget(8192));
  GenerationTimings timings;
  generator.generate(greedy_requests(3, 6, 5), {}, &timings);
  // Step 1: the three prompts (18 tokens) and their first tokens; steps 2-5: one token each.
  EXPECT_EQ(runner.batch_sizes(), (std::vector<int>{18, 3, 3, 3, 3}));
  EXPECT_EQ(timings.prefill_tokens, 18);
  EXPECT_EQ(timings.decode_steps, 4);
  EXPECT_GT(timings.prefill_seconds, 0.0);
  EXPECT_GT(timings.decode_seconds, 0.0);
}

TEST(OfflineGenerator, ChunksPrefillWithinTheBudgetAndCountsMixedStepsAsPrefill) {
  FakeRunner runner(64, 4);
  OfflineGenerator generator(runner, nullptr, {kEos}, options_with_budget(4));
  GenerationTimings timings;
  const auto requests = greedy_requests(2, 5, 4);
  const std::vector<GenerationResult> results = generator.generate(requests, {}, &timings);
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].token_ids, reference_tokens(requests[i].prompt_ids, 4)) << i;
  }
  // Budget 4: A's prompt 4 | A's last 1 + B's first 3 | A decodes + B's last 2 (steps that
  // computed prompt tokens: prefill) | both decode, twice | B's last token.
  EXPECT_EQ(runner.batch_sizes(), (std::vector<int>{4, 4, 3, 2, 2, 1}));
  EXPECT_EQ(timings.prefill_tokens, 10);  // every prompt token, computed once
  EXPECT_EQ(timings.decode_steps, 3);
}

TEST(OfflineGenerator, RefusesWhatTheCacheCannotHold) {
  FakeRunner runner(64, 4);
  OfflineGeneratorOptions options = options_with_budget(8192);
  options.num_kv_blocks = 2;  // 8 tokens; a 6-token prompt + 5 tokens needs 3 blocks
  OfflineGenerator generator(runner, nullptr, {kEos}, options);
  EXPECT_THROW(generator.generate(greedy_requests(1, 6, 5)), Error);
}

TEST(OfflineGenerator, AFailedForwardThrowsTheRunnersError) {
  FakeRunner runner(64, 4);
  runner.set_fail_on_call(1);
  OfflineGenerator generator(runner, nullptr, {kEos}, options_with_budget(8192));
  try {
    generator.generate(greedy_requests(2, 4, 3));
    FAIL() << "expected the runner's error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("device lost"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace attnres::testing
