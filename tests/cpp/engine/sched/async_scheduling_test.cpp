// Async scheduling (EngineConfig::async_scheduling, docs/ENGINE_CONTRACT.md "One step, in
// order"): with a runner whose launch() returns while the step runs (ThreadedRunner: the step
// really runs on another thread), the engine delivers the previous step's outputs and accepts
// new requests in the gap. Every workload here runs twice, overlapped and strictly in order,
// and must stream the same outputs; the overlap itself is observed from inside a step.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "engine_test_util.h"
#include "threaded_runner.h"

namespace attnres::testing {
namespace {

// Maps token t to the letter 'a' + t % 26, one character per token.
class LetterDecoder : public TextDecoder {
 public:
  std::string push(int32_t token) override { return std::string(1, char('a' + token % 26)); }
  std::string flush() override { return {}; }
};

std::string letters(const std::vector<int32_t>& tokens) {
  std::string text;
  for (int32_t t : tokens) text += char('a' + t % 26);
  return text;
}

TEST(AsyncScheduling, IsOnOnlyWhereTheRunnerLaunchesAsynchronously) {
  FakeRunner fake(64, 4);
  ThreadedRunner threaded(fake);
  EXPECT_FALSE(EngineCore(engine_config({}), fake).async_scheduling());
  EXPECT_TRUE(EngineCore(engine_config({}), threaded).async_scheduling());
  EngineConfig off = engine_config({});
  off.async_scheduling = false;
  EXPECT_FALSE(EngineCore(off, threaded).async_scheduling());
}

// The overlap itself. Token k comes from step k - 1; with the overlap it is pushed to the
// stream after step k was launched, and step k (waiting for it on the runner's thread) cannot
// finish before it is: so it was delivered while step k ran. The strict order pushes it
// before launching step k (and the wait is then already satisfied): the first check fails.
// The wait's bound only keeps a broken engine from hanging the test.
TEST(AsyncScheduling, DeliversTheLastStepsOutputWhileTheNextStepRuns) {
  FakeRunner fake(64, 4);
  ThreadedRunner runner(fake);
  std::mutex mutex;
  std::condition_variable pushed;
  std::vector<int> launched_at_push;  // per listener call: steps launched by then
  std::vector<bool> saw_previous_output;
  runner.set_before_step([&](int step) {
    std::unique_lock lock(mutex);
    saw_previous_output.push_back(pushed.wait_for(lock, std::chrono::seconds(20), [&] {
      return static_cast<int>(launched_at_push.size()) >= step;
    }));
  });
  EngineCore engine(engine_config({}), runner);
  EngineRequest request = greedy_request("r", iota_prompt(6, 1), 8);
  request.listener = [&] {
    {
      std::lock_guard lock(mutex);
      launched_at_push.push_back(runner.steps_launched());
    }
    pushed.notify_all();
  };
  SubmitResult r = engine.submit(request);
  run_until_idle(engine);
  Collected c = drain(*r.stream);
  EXPECT_EQ(c.tokens[0], reference_tokens(iota_prompt(6, 1), 8));
  ASSERT_EQ(saw_previous_output.size(), 8u);  // one prefill step, then 7 decode steps
  ASSERT_GE(launched_at_push.size(), 8u);     // 8 tokens (the stream's close may add one)
  for (int k = 1; k < 8; ++k) {
    EXPECT_EQ(launched_at_push[k - 1], k + 1)
        << "token " << k << " was pushed before step " << k << " was launched";
    EXPECT_TRUE(saw_previous_output[k]) << "step " << k;
  }
  EXPECT_EQ(launched_at_push[7], 8);  // the last token: no step left to hide it behind
}

struct WorkloadRun {
  std::vector<Collected> outputs;  // per request
  EngineStats stats;
};

struct Workload {
  EngineSetup setup;
  bool prefix_caching = false;
  // Cancelled once the engine has run this many steps (-1: never).
  int cancel_after_steps = -1;
  std::string cancelled_id;
};

// A mix of everything the output path does: greedy and seeded sampling, n > 1, penalties,
// stop strings, EOS, max_tokens; prompts sharing a prefix (for the prefix cache) and of
// different lengths (chunked prefill beside decodes).
std::vector<EngineRequest> mixed_requests(const std::string& stop) {
  std::vector<EngineRequest> requests;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> prompt = iota_prompt(9, 4);  // a shared "system prompt"
    for (int t = 0; t < 2 + 3 * i; ++t) prompt.push_back((i * 5 + t * 3) % (kVocab - 1));
    EngineRequest request = greedy_request(numbered("r", i), prompt, 6 + 2 * i);
    switch (i % 5) {
      case 1:
        request.params.temperature = 0.9f;
        request.params.seed = 11 + i;
        request.n = 3;
        break;
      case 2:
        request.params.temperature = 1.0f;
        request.params.seed = 3;
        request.params.presence_penalty = 0.5f;
        request.params.frequency_penalty = 0.3f;
        request.params.repetition_penalty = 1.2f;
        break;
      case 3:
        request.params.stop = {stop};
        break;
      case 4:
        request.params.temperature = 0.7f;
        request.params.top_k = 5;
        request.params.seed = 99;
        request.params.logprobs = 2;
        break;
      default:
        break;
    }
    requests.push_back(std::move(request));
  }
  return requests;
}

WorkloadRun run_workload(ModelRunner& runner, bool async,
                         const std::vector<EngineRequest>& requests, const Workload& workload) {
  EngineConfig config = engine_config(workload.setup);
  config.async_scheduling = async;
  config.enable_prefix_caching = workload.prefix_caching;
  config.make_decoder = [](const SamplingParams&) { return std::make_unique<LetterDecoder>(); };
  EngineCore engine(config, runner);
  EXPECT_EQ(engine.async_scheduling(), async);
  std::vector<std::unique_ptr<RequestStream>> streams;
  std::vector<std::string> ids;
  for (const EngineRequest& request : requests) {
    SubmitResult r = engine.submit(request);
    EXPECT_TRUE(r.accepted()) << r.message;
    streams.push_back(std::move(r.stream));
    ids.push_back(request.request_id);
  }
  int steps = 0;
  while (engine.step()) {
    if (++steps == workload.cancel_after_steps) engine.abort(workload.cancelled_id);
    if (steps > 5000) {
      ADD_FAILURE() << "the engine did not go idle";
      engine.shutdown(std::chrono::milliseconds(0));
      break;
    }
  }
  WorkloadRun run;
  for (auto& stream : streams) run.outputs.push_back(drain(*stream));
  run.stats = engine.stats();
  return run;
}

void expect_same_outputs(const Collected& got, const Collected& want, const std::string& what) {
  EXPECT_EQ(got.tokens, want.tokens) << what;
  EXPECT_EQ(got.text, want.text) << what;
  ASSERT_EQ(got.last.size(), want.last.size()) << what;
  for (const auto& [choice, last] : want.last) {
    const RequestOutput& other = got.last.at(choice);
    EXPECT_EQ(other.finish_reason, last.finish_reason) << what << " choice " << choice;
    EXPECT_EQ(other.error, last.error) << what << " choice " << choice;
    EXPECT_EQ(other.stop_string, last.stop_string) << what << " choice " << choice;
  }
  EXPECT_TRUE(got.nothing_after_finish) << what;
  EXPECT_TRUE(got.one_token_per_output) << what;
}

struct Case {
  const char* name;
  Workload workload;
};

class AsyncMatchesSync : public ::testing::TestWithParam<Case> {};

TEST_P(AsyncMatchesSync, SameOutputsForAMixedWorkload) {
  const Workload& workload = GetParam().workload;
  // A stop string the greedy request r3 produces, so that it stops early.
  std::vector<int32_t> r3_prompt = iota_prompt(9, 4);
  for (int t = 0; t < 11; ++t) r3_prompt.push_back((15 + t * 3) % (kVocab - 1));
  const std::string stop = letters(reference_tokens(r3_prompt, 12)).substr(3, 2);
  const std::vector<EngineRequest> requests = mixed_requests(stop);

  FakeRunner sync_runner(workload.setup.num_blocks, workload.setup.block_size);
  sync_runner.set_smooth_logits(true);
  sync_runner.set_eos_after(30);  // the longest requests end with EOS
  FakeRunner async_fake(workload.setup.num_blocks, workload.setup.block_size);
  async_fake.set_smooth_logits(true);
  async_fake.set_eos_after(30);
  ThreadedRunner async_runner(async_fake);

  const WorkloadRun want = run_workload(sync_runner, false, requests, workload);
  const WorkloadRun got = run_workload(async_runner, true, requests, workload);
  for (size_t i = 0; i < requests.size(); ++i) {
    expect_same_outputs(got.outputs[i], want.outputs[i], requests[i].request_id);
  }
  EXPECT_EQ(want.outputs[3].last.at(0).finish_reason, FinishReason::Stop);  // the stop string hit
  EXPECT_EQ(got.stats.generation_tokens_total, want.stats.generation_tokens_total);
  EXPECT_EQ(got.stats.preemptions_total > 0, want.stats.preemptions_total > 0);
  EXPECT_EQ(got.stats.kv_cache_usage, 0.0);  // no block left behind
  EXPECT_TRUE(got.stats.alive);
  if (workload.prefix_caching) {
    EXPECT_GT(got.stats.prefix_cache_hits_total, 0);
  }
  if (workload.cancel_after_steps > 0) {
    const Collected& cancelled = got.outputs[0];
    EXPECT_EQ(cancelled.last.at(0).finish_reason, FinishReason::Abort);
    EXPECT_TRUE(cancelled.last.at(0).error.empty());
  }
}

Workload tight_cache() {
  Workload w;
  w.setup.num_blocks = 24;
  w.setup.max_num_batched_tokens = 16;
  return w;
}

Workload cached(Workload w) {
  w.prefix_caching = true;
  return w;
}

Workload cancelling(Workload w) {
  // r0 (greedy, 6 tokens) is cancelled after its second step: mid-stream in both modes.
  w.cancel_after_steps = 2;
  w.cancelled_id = "r0";
  return w;
}

INSTANTIATE_TEST_SUITE_P(Workloads, AsyncMatchesSync,
                         ::testing::Values(Case{"roomy", Workload{}},
                                           Case{"preempting", tight_cache()},
                                           Case{"prefix_cached", cached(Workload{})},
                                           Case{"prefix_cached_preempting", cached(tight_cache())},
                                           Case{"cancelled_mid_stream", cancelling(Workload{})}),
                         [](const auto& info) { return std::string(info.param.name); });

// The other way to end a request mid-stream: its front end cancels while the engine thread
// runs the overlapped loop. It ends with Abort and a prefix of its tokens; the others finish.
TEST(AsyncScheduling, CancelFromTheFrontEndWhileStepsOverlap) {
  FakeRunner fake(64, 4);
  ThreadedRunner runner(fake);
  // From step 5 on, steps wait for the cancel, so the request cannot finish before it.
  std::atomic<bool> cancelled{false};
  runner.set_before_step([&](int step) {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (step >= 5 && !cancelled && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  EngineCore engine(engine_config({}), runner);
  engine.start();
  SubmitResult doomed = engine.submit(greedy_request("doomed", iota_prompt(5, 1), 100));
  SubmitResult kept = engine.submit(greedy_request("kept", iota_prompt(7, 2), 20));
  ASSERT_TRUE(doomed.accepted() && kept.accepted());
  std::vector<int32_t> doomed_tokens;
  while (std::optional<RequestOutput> out = doomed.stream->next()) {
    doomed_tokens.insert(doomed_tokens.end(), out->token_ids.begin(), out->token_ids.end());
    if (doomed_tokens.size() == 3) {
      doomed.stream->cancel();
      cancelled = true;
    }
    if (out->finished()) {
      EXPECT_EQ(out->finish_reason, FinishReason::Abort);
    }
  }
  const std::vector<int32_t> full = reference_tokens(iota_prompt(5, 1), 100);
  EXPECT_GE(doomed_tokens.size(), 3u);
  EXPECT_LT(doomed_tokens.size(), 100u);
  EXPECT_TRUE(std::equal(doomed_tokens.begin(), doomed_tokens.end(), full.begin()));
  EXPECT_EQ(drain(*kept.stream).tokens[0], reference_tokens(iota_prompt(7, 2), 20));
  EXPECT_TRUE(engine.shutdown(std::chrono::seconds(10)));
  EXPECT_EQ(engine.stats().kv_cache_usage, 0.0);
}

// Front-end threads submitting while the engine thread overlaps its steps: each stream gets
// its own tokens in order (run under TSan: tests/sanitizers/run.sh tsan).
TEST(AsyncScheduling, ConcurrentSubmittersEachReceiveTheirTokens) {
  FakeRunner fake(256, 4);
  ThreadedRunner runner(fake);
  EngineCore engine(engine_config({.num_blocks = 256, .max_num_seqs = 16}), runner);
  ASSERT_TRUE(engine.async_scheduling());
  engine.start();
  std::vector<std::thread> clients;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    clients.emplace_back([&, t] {
      for (int k = 0; k < 5; ++k) {
        const std::vector<int32_t> prompt = iota_prompt(3 + k, t * 10 + k);
        SubmitResult r = engine.submit(greedy_request(numbered("c", t * 100 + k), prompt, 7));
        if (!r.accepted()) {
          failures += 1;
          continue;
        }
        Collected c = drain(*r.stream);
        if (c.tokens[0] != reference_tokens(prompt, 7) || !c.one_token_per_output ||
            c.last[0].finish_reason != FinishReason::Length) {
          failures += 1;
        }
      }
    });
  }
  for (std::thread& client : clients) client.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(engine.shutdown(std::chrono::seconds(10)));
  EXPECT_EQ(engine.stats().generation_tokens_total, 4 * 5 * 7);
}

// Fault isolation holds with the overlap. The step itself failing (here on the runner's own
// thread, so it comes out of collect()) ends every request with the error and the engine;
// the tokens streamed before are the ones the strict order streams.
TEST(AsyncScheduling, AFailingStepEndsEveryRequestAndTheEngine) {
  FakeRunner fake(64, 4);
  fake.set_fail_on_call(2);
  ThreadedRunner runner(fake);
  EngineCore engine(engine_config({}), runner);
  ASSERT_TRUE(engine.async_scheduling());
  SubmitResult a = engine.submit(greedy_request("a", iota_prompt(5, 1), 10));
  SubmitResult b = engine.submit(greedy_request("b", iota_prompt(5, 2), 10));
  run_until_idle(engine);
  for (SubmitResult* r : {&a, &b}) {
    Collected c = drain(*r->stream);
    EXPECT_EQ(c.tokens[0].size(), 2u);
    EXPECT_EQ(c.last[0].finish_reason, FinishReason::Abort);
    EXPECT_NE(c.last[0].error.find("device lost"), std::string::npos) << c.last[0].error;
    EXPECT_TRUE(c.nothing_after_finish);
  }
  EXPECT_FALSE(engine.stats().alive);
  EXPECT_EQ(engine.submit(greedy_request("c", iota_prompt(5, 2), 10)).status,
            SubmitStatus::Unavailable);
}

// A runner whose launch() itself throws (a launch error reported at once, not by the step).
class FailingLaunch : public ThreadedRunner {
 public:
  FailingLaunch(ModelRunner& inner, int fail_on) : ThreadedRunner(inner), fail_on_(fail_on) {}
  void launch(const StepBatch& batch, StepResult& result) override {
    if (calls_++ == fail_on_) throw std::runtime_error("launch refused");
    ThreadedRunner::launch(batch, result);
  }

 private:
  int fail_on_;
  int calls_ = 0;
};

TEST(AsyncScheduling, AFailingLaunchEndsEveryRequestAndTheEngine) {
  FakeRunner fake(64, 4);
  FailingLaunch runner(fake, 3);
  EngineCore engine(engine_config({}), runner);
  SubmitResult a = engine.submit(greedy_request("a", iota_prompt(5, 1), 10));
  run_until_idle(engine);
  Collected c = drain(*a.stream);
  EXPECT_EQ(c.tokens[0].size(), 3u);
  EXPECT_EQ(c.last[0].finish_reason, FinishReason::Abort);
  EXPECT_NE(c.last[0].error.find("launch refused"), std::string::npos) << c.last[0].error;
  EXPECT_FALSE(engine.stats().alive);
}

// One sequence's output path failing ends that sequence alone, with its error; the others
// (its sibling choices included) stream exactly what they stream without the failure.
TEST(AsyncScheduling, AFailingSequenceOutputEndsOnlyThatSequence) {
  FakeRunner fake(64, 4);
  ThreadedRunner runner(fake);
  EngineConfig config = engine_config({});
  int victim_tokens = 0;
  config.output_fault_hook = [&](OutputStage stage, std::string_view request_id) {
    if (request_id == "victim" && stage == OutputStage::StopCheck && ++victim_tokens == 4) {
      throw std::runtime_error("injected");
    }
  };
  EngineCore engine(config, runner);
  SubmitResult victim = engine.submit(greedy_request("victim", iota_prompt(6, 3), 12));
  SubmitResult innocent = engine.submit(greedy_request("innocent", iota_prompt(8, 5), 12));
  run_until_idle(engine);
  Collected v = drain(*victim.stream);
  EXPECT_EQ(v.last[0].finish_reason, FinishReason::Abort);
  EXPECT_NE(v.last[0].error.find("stop check failed: injected"), std::string::npos)
      << v.last[0].error;
  EXPECT_EQ(v.tokens[0].size(), 3u);  // the fourth token's path failed
  Collected i = drain(*innocent.stream);
  EXPECT_EQ(i.tokens[0], reference_tokens(iota_prompt(8, 5), 12));
  EXPECT_TRUE(engine.stats().alive);
  EXPECT_EQ(engine.stats().kv_cache_usage, 0.0);
}

// Graceful shutdown waits for what was accepted, also when its last outputs are still in the
// outbox when the last step ends.
TEST(AsyncScheduling, GracefulShutdownDeliversEverything) {
  FakeRunner fake(64, 4);
  ThreadedRunner runner(fake);
  EngineCore engine(engine_config({}), runner);
  engine.start();
  SubmitResult r = engine.submit(greedy_request("r", iota_prompt(4, 9), 9));
  EXPECT_TRUE(engine.shutdown(std::chrono::seconds(20)));
  Collected c = drain(*r.stream);
  EXPECT_EQ(c.tokens[0], reference_tokens(iota_prompt(4, 9), 9));
  EXPECT_EQ(c.last[0].finish_reason, FinishReason::Length);
  EXPECT_EQ(r.stream->usage().completion_tokens, 9);
}

}  // namespace
}  // namespace attnres::testing
