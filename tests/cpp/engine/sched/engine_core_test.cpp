// EngineCore driven step by step on the test's thread (no engine thread): what each stream
// receives, fan-out, validation, the bounded queue, aborts, stops and a failing forward.
#include <gtest/gtest.h>

#include "engine_test_util.h"

namespace attnres::testing {
namespace {

TEST(EngineCore, StreamsOneOutputPerTokenInOrderWithUsageAndTimings) {
  FakeRunner runner(64, 4);
  EngineCore engine(engine_config({}), runner);
  SubmitResult submitted = engine.submit(greedy_request("r1", iota_prompt(5, 3), 6));
  ASSERT_TRUE(submitted.accepted()) << submitted.message;
  RequestStream& stream = *submitted.stream;

  // Step 1 prefills the prompt and samples the first token: exactly one output is ready.
  ASSERT_TRUE(engine.step());
  RequestOutput out;
  ASSERT_EQ(stream.next_for(std::chrono::milliseconds(0), out), RequestStream::Poll::Output);
  EXPECT_EQ(out.token_ids, std::vector<int32_t>{reference_tokens(iota_prompt(5, 3), 1)[0]});
  EXPECT_EQ(stream.next_for(std::chrono::milliseconds(0), out), RequestStream::Poll::Timeout);

  run_until_idle(engine);
  Collected c = drain(stream);
  std::vector<int32_t> expected = reference_tokens(iota_prompt(5, 3), 6);
  expected.erase(expected.begin());  // read above
  EXPECT_EQ(c.tokens[0], expected);
  EXPECT_TRUE(c.one_token_per_output);
  EXPECT_EQ(c.last[0].finish_reason, FinishReason::Length);
  EXPECT_TRUE(stream.ended());
  EXPECT_EQ(stream.usage().prompt_tokens, 5);
  EXPECT_EQ(stream.usage().completion_tokens, 6);
  const RequestTimings t = stream.timings();
  ASSERT_TRUE(t.first_scheduled && t.first_token && t.finished);
  EXPECT_LE(t.arrival, *t.first_scheduled);
  EXPECT_LE(*t.first_scheduled, *t.first_token);
  EXPECT_LE(*t.first_token, *t.finished);

  const EngineStats stats = engine.stats();
  EXPECT_EQ(stats.prompt_tokens_total, 5);
  EXPECT_EQ(stats.generation_tokens_total, 6);
  EXPECT_EQ(stats.finished_length, 1);
  EXPECT_EQ(stats.num_running, 0);
  EXPECT_EQ(stats.kv_cache_usage, 0.0);
}

TEST(EngineCore, EosEndsWithStopAndReportsTheStopToken) {
  // The fake model emits EOS for position 8: prompt 0..4, tokens at 5, 6, 7, then EOS.
  FakeRunner runner(64, 4);
  runner.set_eos_after(8);
  EngineCore engine(engine_config({}), runner);
  SubmitResult submitted = engine.submit(greedy_request("r1", iota_prompt(5, 3), 50));
  run_until_idle(engine);
  Collected c = drain(*submitted.stream);
  std::vector<int32_t> expected = reference_tokens(iota_prompt(5, 3), 3);
  expected.push_back(kEos);
  EXPECT_EQ(c.tokens[0], expected);
  EXPECT_EQ(c.last[0].finish_reason, FinishReason::Stop);
  EXPECT_EQ(c.last[0].stop_token, kEos);
  EXPECT_EQ(submitted.stream->usage().completion_tokens, 4);
}

TEST(EngineCore, NChoicesFanOutWithSeedPlusChoiceIndex) {
  // Random sampling over a real distribution. Choice i of a seeded n=3 request must draw
  // exactly what an n=1 request with seed + i draws (vLLM), batched together or not.
  FakeRunner runner(128, 4);
  runner.set_smooth_logits(true);
  EngineCore engine(engine_config({.num_blocks = 128}), runner);
  auto sampled = [](const std::string& id, uint64_t seed, int n) {
    EngineRequest r = greedy_request(id, iota_prompt(4, 1), 10);
    r.params.temperature = 1.0f;
    r.params.seed = seed;
    r.n = n;
    return r;
  };
  SubmitResult fan = engine.submit(sampled("fan", 42, 3));
  ASSERT_TRUE(fan.accepted()) << fan.message;
  std::vector<std::unique_ptr<RequestStream>> solo;
  for (int i = 0; i < 3; ++i) {
    solo.push_back(engine.submit(sampled(numbered("solo", i), 42 + i, 1)).stream);
    ASSERT_NE(solo.back(), nullptr);
  }
  run_until_idle(engine);
  Collected c = drain(*fan.stream);
  ASSERT_EQ(c.tokens.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c.tokens[i], drain(*solo[i]).tokens[0]) << "choice " << i;
    EXPECT_EQ(c.tokens[i].size(), 10u);
    EXPECT_EQ(c.last[i].finish_reason, FinishReason::Length);
  }
  EXPECT_FALSE(c.tokens[0] == c.tokens[1] && c.tokens[1] == c.tokens[2]);
  EXPECT_TRUE(c.nothing_after_finish);
  EXPECT_EQ(fan.stream->usage().prompt_tokens, 4);
  EXPECT_EQ(fan.stream->usage().completion_tokens, 30);
}

TEST(EngineCore, RejectsBeyondTheQueueBoundUntilRequestsAreScheduled) {
  FakeRunner runner(64, 4);
  EngineCore engine(engine_config({.max_queued_requests = 2}), runner);
  SubmitResult a = engine.submit(greedy_request("a", iota_prompt(3, 1), 4));
  SubmitResult b = engine.submit(greedy_request("b", iota_prompt(3, 2), 4));
  SubmitResult c = engine.submit(greedy_request("c", iota_prompt(3, 3), 4));
  EXPECT_TRUE(a.accepted() && b.accepted());
  EXPECT_EQ(c.status, SubmitStatus::QueueFull);
  EXPECT_EQ(c.stream, nullptr);
  EXPECT_EQ(engine.stats().num_queued_requests, 2);
  engine.step();  // a and b are scheduled: no longer queued
  EXPECT_EQ(engine.stats().num_queued_requests, 0);
  SubmitResult d = engine.submit(greedy_request("d", iota_prompt(3, 3), 4));
  ASSERT_TRUE(d.accepted()) << d.message;
  run_until_idle(engine);
  EXPECT_EQ(drain(*d.stream).tokens[0], reference_tokens(iota_prompt(3, 3), 4));
}

TEST(EngineCore, InvalidRequestsAreRejectedAtSubmitWithTheFieldNamed) {
  FakeRunner runner(64, 4);
  EngineCore engine(engine_config({.max_model_len = 100}), runner);
  SubmitResult too_long = engine.submit(greedy_request("x", iota_prompt(90, 1), 20));
  EXPECT_EQ(too_long.status, SubmitStatus::InvalidRequest);
  EXPECT_NE(too_long.message.find("maximum context length is 100"), std::string::npos);
  EXPECT_NE(too_long.message.find("110 tokens (90 in the messages, 20 in the completion)"),
            std::string::npos)
      << too_long.message;
  EXPECT_EQ(engine.submit(greedy_request("x", {1, kVocab}, 2)).status,
            SubmitStatus::InvalidRequest);
  EXPECT_EQ(engine.submit(greedy_request("x", {}, 2)).status, SubmitStatus::InvalidRequest);
  EXPECT_EQ(engine.submit(greedy_request("", {1}, 2)).status, SubmitStatus::InvalidRequest);
  EngineRequest zero_n = greedy_request("x", {1}, 2);
  zero_n.n = 0;
  EXPECT_NE(engine.submit(zero_n).message.find("n: got 0"), std::string::npos);
  EngineRequest bad_top_p = greedy_request("x", {1}, 2);
  bad_top_p.params.top_p = 2.0f;
  EXPECT_EQ(engine.submit(bad_top_p).status, SubmitStatus::InvalidRequest);

  SubmitResult first = engine.submit(greedy_request("same", {1}, 2));
  ASSERT_TRUE(first.accepted());
  SubmitResult duplicate = engine.submit(greedy_request("same", {1}, 2));
  EXPECT_EQ(duplicate.status, SubmitStatus::InvalidRequest);
  EXPECT_NE(duplicate.message.find("already in use"), std::string::npos);
  run_until_idle(engine);
  drain(*first.stream);
  EXPECT_TRUE(engine.submit(greedy_request("same", {1}, 2)).accepted());  // finished: reusable
}

TEST(EngineCore, CancelFreesTheBlocksWithinOneStep) {
  FakeRunner runner(64, 4);
  EngineCore engine(engine_config({}), runner);
  SubmitResult a = engine.submit(greedy_request("a", iota_prompt(9, 1), 40));
  SubmitResult b = engine.submit(greedy_request("b", iota_prompt(9, 2), 40));
  engine.step();
  engine.step();
  EXPECT_GT(engine.stats().kv_cache_usage, 0.0);
  a.stream->cancel();
  engine.abort("b");  // the other path: by id, as gRPC Abort does
  engine.step();
  EXPECT_EQ(engine.stats().kv_cache_usage, 0.0);
  EXPECT_EQ(engine.stats().num_running, 0);
  for (SubmitResult* r : {&a, &b}) {
    Collected c = drain(*r->stream);
    EXPECT_EQ(c.tokens[0].size(), 2u);  // two steps ran before the cancel
    EXPECT_EQ(c.last[0].finish_reason, FinishReason::Abort);
    EXPECT_TRUE(c.last[0].error.empty());
  }
  EXPECT_EQ(engine.stats().finished_abort, 2);
  EXPECT_FALSE(engine.step());
}

TEST(EngineCore, DroppingAStreamCancelsItsRequest) {
  FakeRunner runner(64, 4);
  EngineCore engine(engine_config({}), runner);
  {
    SubmitResult a = engine.submit(greedy_request("a", iota_prompt(9, 1), 40));
    engine.step();
  }  // the front end lost interest (client disconnected) without calling cancel()
  engine.step();
  EXPECT_EQ(engine.stats().kv_cache_usage, 0.0);
  EXPECT_EQ(engine.stats().finished_abort, 1);
}

TEST(EngineCore, PreemptionInsideTheEngineKeepsEveryOutputExact) {
  FakeRunner runner(12, 4);
  EngineCore engine(engine_config({.num_blocks = 12, .max_num_batched_tokens = 16}), runner);
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int i = 0; i < 8; ++i) {
    SubmitResult r = engine.submit(greedy_request(numbered("r", i), iota_prompt(4 + i, i), 12));
    ASSERT_TRUE(r.accepted()) << r.message;
    streams.push_back(std::move(r.stream));
  }
  run_until_idle(engine);
  for (int i = 0; i < 8; ++i) {
    Collected c = drain(*streams[i]);
    EXPECT_EQ(c.tokens[0], reference_tokens(iota_prompt(4 + i, i), 12)) << i;
    EXPECT_TRUE(c.one_token_per_output) << i;  // a recompute emits no duplicate tokens
    EXPECT_EQ(c.last[0].finish_reason, FinishReason::Length);
  }
  const EngineStats stats = engine.stats();
  EXPECT_GT(stats.preemptions_total, 0);
  EXPECT_EQ(stats.generation_tokens_total, 8 * 12);
  EXPECT_EQ(stats.kv_cache_usage, 0.0);
}

// Maps token t to the letter 'a' + t % 26, one character per token.
class LetterDecoder : public TextDecoder {
 public:
  std::string push(int32_t token) override { return std::string(1, char('a' + token % 26)); }
  std::string flush() override { return {}; }
};

TEST(EngineCore, StopStringsTruncateTheStreamedText) {
  FakeRunner runner(64, 4);
  EngineConfig config = engine_config({});
  config.make_decoder = [](const SamplingParams&) { return std::make_unique<LetterDecoder>(); };
  EngineCore engine(config, runner);
  std::string full;
  for (int32_t t : reference_tokens(iota_prompt(5, 3), 12)) full += char('a' + t % 26);
  const std::string stop = full.substr(4, 2);
  const std::string expected_text = full.substr(0, full.find(stop));

  EngineRequest request = greedy_request("r", iota_prompt(5, 3), 12);
  request.params.stop = {stop};
  SubmitResult r = engine.submit(request);
  run_until_idle(engine);
  Collected c = drain(*r.stream);
  EXPECT_EQ(c.text[0], expected_text);
  EXPECT_EQ(c.last[0].finish_reason, FinishReason::Stop);
  EXPECT_EQ(c.last[0].stop_string, stop);
}

TEST(EngineCore, AFailingForwardEndsEveryRequestAndTheEngine) {
  FakeRunner runner(64, 4);
  runner.set_fail_on_call(2);
  EngineCore engine(engine_config({}), runner);
  SubmitResult a = engine.submit(greedy_request("a", iota_prompt(5, 1), 10));
  SubmitResult b = engine.submit(greedy_request("b", iota_prompt(5, 2), 10));
  run_until_idle(engine);
  for (SubmitResult* r : {&a, &b}) {
    Collected c = drain(*r->stream);
    EXPECT_EQ(c.tokens[0].size(), 2u);
    EXPECT_EQ(c.last[0].finish_reason, FinishReason::Abort);
    EXPECT_NE(c.last[0].error.find("device lost"), std::string::npos) << c.last[0].error;
  }
  EXPECT_FALSE(engine.stats().alive);
  SubmitResult later = engine.submit(greedy_request("c", iota_prompt(5, 2), 10));
  EXPECT_EQ(later.status, SubmitStatus::Unavailable);
}

// A runner that fills StepResult::sampled_ids although it does not sample on the device: the
// engine refuses the step (a failure of the step: the engine stops) rather than guess which
// rows the ids belong to. (Runners that do sample: device_sampling_test.cpp.)
class DeviceSamplingRunner : public FakeRunner {
 public:
  using FakeRunner::FakeRunner;
  void execute(const StepBatch& batch, StepResult& result) override {
    FakeRunner::execute(batch, result);
    result.sampled_ids.assign(batch.logit_rows.size(), 0);
  }
};

TEST(EngineCore, SampledIdsTheEngineDidNotAskForAreAForwardFailure) {
  // The runner does not sample on the device (samples_on_device() is false), so the engine
  // asks for no sampled ids: returning some is a broken runner, and the step fails.
  DeviceSamplingRunner runner(64, 4);
  EngineCore engine(engine_config({}), runner);
  SubmitResult r = engine.submit(greedy_request("r", iota_prompt(5, 1), 4));
  run_until_idle(engine);
  Collected c = drain(*r.stream);
  EXPECT_TRUE(c.tokens[0].empty());
  EXPECT_EQ(c.last[0].finish_reason, FinishReason::Abort);
  EXPECT_NE(c.last[0].error.find("wrong number of sampled token ids"), std::string::npos)
      << c.last[0].error;
  EXPECT_FALSE(engine.stats().alive);
}

TEST(EngineCore, ShutdownWithoutAThreadRunsTheRemainingSteps) {
  FakeRunner runner(64, 4);
  EngineCore engine(engine_config({}), runner);
  SubmitResult r = engine.submit(greedy_request("r", iota_prompt(5, 1), 7));
  EXPECT_TRUE(engine.shutdown(std::chrono::seconds(60)));
  EXPECT_EQ(drain(*r.stream).tokens[0], reference_tokens(iota_prompt(5, 1), 7));
  EXPECT_EQ(engine.submit(greedy_request("s", {1}, 1)).status, SubmitStatus::Unavailable);
}

}  // namespace
}  // namespace attnres::testing
