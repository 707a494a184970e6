// EngineCore on its own engine thread: front-end threads submit and read concurrently, cancel,
// and shut the engine down. Synchronisation is only through the streams' blocking next() and
// shutdown()'s join; no sleeps.
#include <gtest/gtest.h>

#include <thread>

#include "engine_test_util.h"

namespace attnres::testing {
namespace {

TEST(EngineThread, ConcurrentSubmittersEachReceiveTheirTokensInOrder) {
  // A cache of 16 blocks for 4 x 5 requests of up to 24 tokens (6 blocks): preemption and
  // chunked prefill happen while front-end threads come and go.
  FakeRunner runner(16, 4);
  EngineCore engine(engine_config({.num_blocks = 16, .max_num_batched_tokens = 12}), runner);
  engine.start();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 5;
  std::vector<std::string> failures[kThreads];
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::unique_ptr<RequestStream>> streams;
      for (int i = 0; i < kPerThread; ++i) {
        const int k = t * kPerThread + i;
        SubmitResult r =
            engine.submit(greedy_request(numbered("t", k), iota_prompt(3 + k % 9, k), 4 + k % 11));
        if (!r.accepted()) {
          failures[t].push_back(r.message);
          return;
        }
        streams.push_back(std::move(r.stream));
      }
      for (int i = 0; i < kPerThread; ++i) {
        const int k = t * kPerThread + i;
        Collected c = drain(*streams[i]);
        if (c.tokens[0] != reference_tokens(iota_prompt(3 + k % 9, k), 4 + k % 11)) {
          failures[t].push_back("request " + std::to_string(k) + ": wrong tokens");
        }
        if (!c.one_token_per_output) failures[t].push_back("request " + std::to_string(k));
        if (c.last[0].finish_reason != FinishReason::Length) {
          failures[t].push_back("request " + std::to_string(k) + ": finish reason");
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(failures[t].empty()) << failures[t].front();
  EXPECT_TRUE(engine.shutdown(std::chrono::seconds(60)));
  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.finished_length, kThreads * kPerThread);
  EXPECT_EQ(stats.kv_cache_usage, 0.0);
  EXPECT_EQ(stats.num_running + stats.num_waiting, 0);
}

TEST(EngineThread, CancelFromTheFrontEndEndsTheStreamWithAbort) {
  FakeRunner runner(600, 16);
  EngineCore engine(engine_config({.num_blocks = 600, .block_size = 16, .max_model_len = 8192}),
                    runner);
  engine.start();
  SubmitResult r = engine.submit(greedy_request("long", iota_prompt(8, 1), 8000));
  ASSERT_TRUE(r.accepted());
  std::vector<int32_t> tokens;
  for (int i = 0; i < 3; ++i) tokens.push_back(r.stream->next()->token_ids.at(0));
  r.stream->cancel();
  Collected rest = drain(*r.stream);
  EXPECT_EQ(rest.last[0].finish_reason, FinishReason::Abort);
  tokens.insert(tokens.end(), rest.tokens[0].begin(), rest.tokens[0].end());
  EXPECT_LT(tokens.size(), 8000u);
  const std::vector<int32_t> reference = reference_tokens(iota_prompt(8, 1), tokens.size());
  EXPECT_EQ(tokens, reference);
  EXPECT_TRUE(engine.shutdown(std::chrono::seconds(60)));  // nothing left to wait for
  EXPECT_EQ(engine.stats().kv_cache_usage, 0.0);
}

TEST(EngineThread, GracefulShutdownLetsAcceptedRequestsFinish) {
  FakeRunner runner(64, 4);
  EngineCore engine(engine_config({}), runner);
  engine.start();
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int i = 0; i < 3; ++i) {
    streams.push_back(
        engine.submit(greedy_request(numbered("g", i), iota_prompt(5, i), 20)).stream);
    ASSERT_NE(streams.back(), nullptr);
  }
  EXPECT_TRUE(engine.shutdown(std::chrono::seconds(60)));
  EXPECT_EQ(engine.submit(greedy_request("late", {1}, 1)).status, SubmitStatus::Unavailable);
  for (int i = 0; i < 3; ++i) {
    Collected c = drain(*streams[i]);
    EXPECT_EQ(c.tokens[0], reference_tokens(iota_prompt(5, i), 20));
    EXPECT_EQ(c.last[0].finish_reason, FinishReason::Length);
  }
}

TEST(EngineThread, ShutdownAbortsWhatIsLeftAfterTheGracePeriod) {
  // 20000 tokens cannot finish inside a zero grace period.
  FakeRunner runner(1300, 16);
  EngineCore engine(engine_config({.num_blocks = 1300, .block_size = 16, .max_model_len = 32768}),
                    runner);
  engine.start();
  SubmitResult r = engine.submit(greedy_request("long", iota_prompt(8, 1), 20000));
  ASSERT_TRUE(r.accepted());
  ASSERT_TRUE(r.stream->next().has_value());  // it is running
  EXPECT_FALSE(engine.shutdown(std::chrono::milliseconds(0)));
  Collected rest = drain(*r.stream);
  EXPECT_EQ(rest.last[0].finish_reason, FinishReason::Abort);
  EXPECT_EQ(engine.stats().kv_cache_usage, 0.0);
  EXPECT_EQ(engine.stats().finished_abort, 1);
}

}  // namespace
}  // namespace attnres::testing
