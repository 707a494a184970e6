// Automatic prefix caching in the engine loop, over the fake forward that reads every token
// back through the block tables (a wrong shared block changes the tokens). Every workload runs
// twice, cache off and on, and must give the same tokens; with the cache on, the hit counters
// move, usage reports the cached prompt tokens, and no block is left in use at the end.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_test_util.h"

namespace attnres::testing {
namespace {

// A system prompt shared by every request, then a per-request tail.
std::vector<int32_t> shared_prefix_prompt(int shared, int tail, int32_t salt) {
  std::vector<int32_t> prompt = iota_prompt(shared, 5);
  for (int i = 0; i < tail; ++i) prompt.push_back((salt * 7 + i) % (kVocab - 1));
  return prompt;
}

struct WaveRun {
  std::vector<std::map<int, std::vector<int32_t>>> tokens;  // per request, per choice
  std::vector<Usage> usage;
  EngineStats stats;
  int forward_tokens = 0;  // tokens the forward computed in all
};

// Submits the requests in waves (a wave is submitted once the previous one finished, so the
// later waves can hit what the earlier ones computed) and runs them to the end.
WaveRun run_waves(const std::vector<std::vector<EngineRequest>>& waves, bool cache,
              const EngineSetup& setup) {
  FakeRunner runner(setup.num_blocks, setup.block_size);
  EngineConfig config = engine_config(setup);
  config.enable_prefix_caching = cache;
  EngineCore engine(config, runner);
  WaveRun run;
  for (const auto& wave : waves) {
    std::vector<std::unique_ptr<RequestStream>> streams;
    for (const EngineRequest& request : wave) {
      SubmitResult r = engine.submit(request);
      EXPECT_TRUE(r.accepted()) << r.message;
      streams.push_back(std::move(r.stream));
    }
    run_until_idle(engine);
    for (auto& stream : streams) {
      run.tokens.push_back(drain(*stream).tokens);
      run.usage.push_back(stream->usage());
    }
  }
  run.stats = engine.stats();
  for (int n : runner.batch_sizes()) run.forward_tokens += n;
  return run;
}

std::vector<std::vector<EngineRequest>> chat_like_waves() {
  std::vector<std::vector<EngineRequest>> waves(3);
  for (int w = 0; w < 3; ++w) {
    for (int r = 0; r < 4; ++r) {
      EngineRequest request =
          greedy_request(numbered("w", w * 10 + r), shared_prefix_prompt(21, 3 + r, w * 4 + r), 6);
      if (r == 1) request.n = 2;
      if (r == 2) {
        request.params.temperature = 1.0f;
        request.params.seed = 5 + w;
      }
      waves[w].push_back(request);
    }
  }
  return waves;
}

TEST(EnginePrefixCache, SameTokensWithAndWithoutTheCacheAndFewerTokensComputed) {
  const EngineSetup setup{.num_blocks = 64, .block_size = 4, .max_num_batched_tokens = 16};
  const WaveRun off = run_waves(chat_like_waves(), false, setup);
  const WaveRun on = run_waves(chat_like_waves(), true, setup);
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_LT(on.forward_tokens, off.forward_tokens);
  // The first wave warms the cache (no hit is possible across its requests before their
  // prefills finish); later waves hit the 20 tokens of shared full blocks.
  EXPECT_GT(on.stats.prefix_cache_hits_total, 0);
  EXPECT_GE(on.stats.prefix_cache_queries_total, on.stats.prefix_cache_hits_total);
  EXPECT_EQ(off.stats.prefix_cache_queries_total, 0);
  EXPECT_EQ(on.usage[4].cached_tokens, 20);  // wave 2, request 0: 5 full blocks of 4
  EXPECT_EQ(on.usage[4].prompt_tokens, off.usage[4].prompt_tokens);
  EXPECT_EQ(off.usage[4].cached_tokens, 0);
  EXPECT_EQ(on.stats.kv_cache_usage, 0.0);  // cached blocks nobody holds count as free
  EXPECT_EQ(on.stats.num_running, 0);
}

TEST(EnginePrefixCache, PreemptionUnderATightCacheGivesTheSameTokens) {
  // 14 blocks of 4 tokens for requests that need up to 8 blocks each: preemption happens.
  const EngineSetup setup{.num_blocks = 14, .block_size = 4, .max_num_batched_tokens = 12};
  std::vector<std::vector<EngineRequest>> waves(2);
  for (int w = 0; w < 2; ++w)
    for (int r = 0; r < 5; ++r)
      waves[w].push_back(greedy_request(numbered("p", w * 10 + r),
                                        shared_prefix_prompt(12, 2 + r, r), 14));
  const WaveRun off = run_waves(waves, false, setup);
  const WaveRun on = run_waves(waves, true, setup);
  EXPECT_GT(on.stats.preemptions_total, 0);
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_GT(on.stats.prefix_cache_hits_total, 0);
  EXPECT_EQ(on.stats.kv_cache_usage, 0.0);
}

TEST(EnginePrefixCache, PromptLogprobAndDepthRequestsComputeWhatTheyNeed) {
  // A request asking for prompt logprobs or depth weights needs a row for every prompt
  // position: it may not take those positions from the cache, and its answer must match a
  // cold run.
  const EngineSetup setup{.num_blocks = 64, .block_size = 4, .max_num_batched_tokens = 64};
  for (const bool depth : {false, true}) {
    for (const bool cache : {false, true}) {
      FakeRunner runner(setup.num_blocks, setup.block_size);
      runner.set_allow_inner_rows(true);
      runner.set_depth_layout(2, 3);
      EngineConfig config = engine_config(setup);
      config.enable_prefix_caching = cache;
      EngineCore engine(config, runner);
      const std::vector<int32_t> prompt = shared_prefix_prompt(16, 4, 1);
      SubmitResult warm = engine.submit(greedy_request("warm", prompt, 3));
      run_until_idle(engine);
      drain(*warm.stream);
      EngineRequest request = greedy_request("asks", prompt, 3);
      if (depth) {
        request.params.depth_attention = true;
      } else {
        request.params.prompt_logprobs = 1;
      }
      SubmitResult r = engine.submit(request);
      run_until_idle(engine);
      std::optional<RequestOutput> first = r.stream->next();
      ASSERT_TRUE(first.has_value());
      if (depth) {
        ASSERT_TRUE(first->depth_prompt_mean.has_value());
        // Cells a sublayer does not have are NaN in both runs; the rest must be equal.
        static std::vector<float> cold;
        const std::vector<float>& got = first->depth_prompt_mean->values;
        if (!cache) cold = got;
        ASSERT_EQ(got.size(), cold.size());
        for (size_t c = 0; c < got.size(); ++c) {
          if (std::isnan(cold[c])) {
            EXPECT_TRUE(std::isnan(got[c])) << c;
          } else {
            EXPECT_EQ(got[c], cold[c]) << c;
          }
        }
      } else {
        ASSERT_EQ(first->prompt_logprobs.size(), prompt.size());
        for (size_t p = 1; p < prompt.size(); ++p) ASSERT_TRUE(first->prompt_logprobs[p]);
      }
      drain(*r.stream);
      EXPECT_EQ(r.stream->usage().cached_tokens, 0) << "depth " << depth << " cache " << cache;
    }
  }
}

}  // namespace
}  // namespace attnres::testing
