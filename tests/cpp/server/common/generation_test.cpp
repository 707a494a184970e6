// server/common/generation.h over a real engine thread (fake forward): outputs of several
// prompts read as one stream with global choice indices, woken by the listener or wait_for
// without polling (a missed wake-up hangs the test until ctest's timeout fails it), refusals
// as RequestError, and the request's metrics recorded once per prompt.
#include "server/common/generation.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

#include "engine/model/loaded_model.h"
#include "engine_test_util.h"
#include "server/common/request_error.h"

namespace attnres::testing {
namespace {

using server::Generation;
using server::Refusal;
using server::RequestError;

constexpr auto kForever = std::chrono::hours(1);

struct Fixture {
  explicit Fixture(EngineSetup setup = {}) : engine(engine_config(setup), runner) {}

  server::ServeOptions options() const {
    server::ServeOptions o;
    o.served_model_name = "test";
    o.max_model_len = 128;
    return o;
  }

  LoadedModel model = load_builtin_model("demo");  // the tokenizer ServerState holds
  FakeRunner runner{64, 4};
  EngineCore engine;
  server::Metrics metrics{"test"};
  server::ServerState state{model, engine, metrics, options()};
};

SamplingParams greedy(int max_tokens) {
  SamplingParams params;
  params.temperature = 0.0f;
  params.max_tokens = max_tokens;
  params.ignore_eos = true;
  return params;
}

// Reads everything, blocking in wait_for between outputs.
std::map<int, std::vector<int32_t>> read_blocking(Generation& generation) {
  std::map<int, std::vector<int32_t>> tokens;
  RequestOutput out;
  while (!generation.ended()) {
    if (!generation.next(out)) {
      if (!generation.ended()) generation.wait_for(kForever);  // next() may have seen the end
      continue;
    }
    tokens[out.choice_index].insert(tokens[out.choice_index].end(), out.token_ids.begin(),
                                    out.token_ids.end());
  }
  return tokens;
}

TEST(Generation, PromptsAndChoicesReadAsOneStreamWithGlobalIndices) {
  Fixture f;
  f.engine.start();
  const std::vector<std::vector<int32_t>> prompts = {{1, 2, 3}, {4, 5}, {6}};
  Generation generation(f.state, "req", prompts, greedy(5), /*n=*/2);
  EXPECT_EQ(generation.num_choices(), 6);
  const auto tokens = read_blocking(generation);
  ASSERT_EQ(tokens.size(), 6u);
  for (int choice = 0; choice < 6; ++choice) {
    const std::vector<int32_t>& prompt = prompts[static_cast<size_t>(choice / 2)];
    EXPECT_EQ(tokens.at(choice), reference_tokens(prompt, 5)) << "choice " << choice;
  }
  const Usage usage = generation.usage();
  EXPECT_EQ(usage.prompt_tokens, 6);       // each prompt counted once
  EXPECT_EQ(usage.completion_tokens, 30);  // every choice
  f.engine.shutdown(std::chrono::seconds(10));
}

TEST(Generation, TheListenerWakesAnEventDrivenReader) {
  Fixture f;
  std::mutex mutex;
  std::condition_variable woken_cv;
  int wakes = 0;
  Generation generation(f.state, "req", {{1, 2, 3}}, greedy(4), 1);
  generation.set_listener([&] {
    std::lock_guard lock(mutex);
    ++wakes;
    woken_cv.notify_all();
  });
  f.engine.start();
  std::vector<int32_t> tokens;
  RequestOutput out;
  int seen_wakes = 0;
  while (!generation.ended()) {
    while (generation.next(out))
      tokens.insert(tokens.end(), out.token_ids.begin(), out.token_ids.end());
    if (generation.ended()) break;
    std::unique_lock lock(mutex);
    woken_cv.wait(lock, [&] { return wakes > seen_wakes; });  // only a wake-up moves on
    seen_wakes = wakes;
  }
  EXPECT_EQ(tokens, reference_tokens({1, 2, 3}, 4));
  {
    std::lock_guard lock(mutex);
    EXPECT_GE(wakes, 2);  // at least one output, and the end
  }
  f.engine.shutdown(std::chrono::seconds(10));
}

TEST(Generation, RefusalsAreRequestErrors) {
  Fixture f;
  f.engine.start();
  try {
    Generation g(f.state, "long", {std::vector<int32_t>(100, 1)}, greedy(100), 1);
    FAIL() << "a request past max_model_len was accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.refusal(), Refusal::InvalidArgument);
  }
  f.state.stop_accepting();
  try {
    Generation g(f.state, "late", {{1}}, greedy(1), 1);
    FAIL() << "a request was accepted while shutting down";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.refusal(), Refusal::Unavailable);
    EXPECT_NE(std::string(e.what()).find("shutting down"), std::string::npos);
  }
  f.engine.shutdown(std::chrono::seconds(10));
}

TEST(Generation, AFailedLaterPromptCancelsTheEarlierOnes) {
  Fixture f;  // not started: the first prompt stays queued, so its cancellation is visible
  try {
    Generation g(f.state, "pair", {{1, 2}, std::vector<int32_t>(200, 1)}, greedy(4), 1);
    FAIL() << "the second prompt was accepted";
  } catch (const RequestError& e) {
    EXPECT_EQ(e.refusal(), Refusal::InvalidArgument);
  }
  run_until_idle(f.engine);
  EXPECT_EQ(f.engine.stats().num_running + f.engine.stats().num_waiting, 0);
  EXPECT_EQ(f.engine.stats().finished_abort, 1);
}

TEST(Generation, MetricsAreRecordedOncePerPromptWhenItsStreamEnds) {
  Fixture f;
  f.engine.start();
  {
    Generation generation(f.state, "req", {{1, 2}, {3, 4}}, greedy(3), 1);
    read_blocking(generation);
  }
  f.engine.shutdown(std::chrono::seconds(10));
  const std::string text = f.metrics.render(f.engine.stats());
  EXPECT_NE(text.find("attnres:e2e_request_latency_seconds_count{model_name=\"test\"} 2"),
            std::string::npos)
      << text;
  // 3 tokens per prompt: 2 gaps each.
  EXPECT_NE(text.find("attnres:inter_token_latency_seconds_count{model_name=\"test\"} 4"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace attnres::testing
