// The runner with a fake backend: the concurrency limit is never exceeded (a count of requests
// in flight, not a timing), outputs come back in prompt order with their ids, warm-ups are sent
// and not measured, and a misbehaving backend (wrong lengths, an exception) fails only its
// request.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

#include "clients/bench/runner.h"
#include "engine/core/error.h"

namespace attnres::bench {
namespace {

class FakeBackend : public ServingBackend {
 public:
  std::string first_model() override { return "fake"; }
  void check_model(const std::string&) override {}
  std::unique_ptr<PromptTokenizer> tokenizer(const RequestSettings&) override { return nullptr; }

  RequestOutput send(const BenchPrompt& prompt, const RequestSettings&,
                     const std::string& request_id) override {
    const int now_in_flight = ++in_flight_;
    int seen = max_in_flight_.load();
    while (now_in_flight > seen && !max_in_flight_.compare_exchange_weak(seen, now_in_flight)) {
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ids_.push_back(request_id);
    }
    RequestOutput out;
    out.start_time = steady_seconds();
    if (prompt.text == "throw") {
      --in_flight_;
      throw std::runtime_error("backend bug");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    out.success = true;
    out.ttft = 0.001;
    out.latency = 0.005;
    out.prompt_len = prompt.prompt_len;
    out.output_tokens = prompt.text == "short" ? prompt.output_len - 1 : prompt.output_len;
    out.generated_text = prompt.text;
    --in_flight_;
    return out;
  }

  int max_in_flight() const { return max_in_flight_; }
  std::vector<std::string> ids() {
    std::lock_guard<std::mutex> lock(mutex_);
    return ids_;
  }

 private:
  std::atomic<int> in_flight_{0}, max_in_flight_{0};
  std::mutex mutex_;
  std::vector<std::string> ids_;
};

// "p<i>" (built by appending: GCC 12 warns falsely about "p" + std::string, -Wrestrict).
std::string prompt_text(int i) {
  std::string text = "p";
  text += std::to_string(i);
  return text;
}

std::vector<BenchPrompt> prompts(int n) {
  std::vector<BenchPrompt> p;
  for (int i = 0; i < n; ++i) p.push_back({prompt_text(i), 10, 4, {}});
  return p;
}

TEST(Runner, RespectsMaxConcurrencyAndKeepsOrder) {
  FakeBackend backend;
  RequestSettings settings;
  settings.request_id_prefix = "bench-x-";
  RunOptions options;
  options.max_concurrency = 3;
  const RunResult r = run_benchmark(backend, prompts(12), settings, options);
  ASSERT_EQ(r.outputs.size(), 12u);
  EXPECT_LE(backend.max_in_flight(), 3);
  EXPECT_GT(r.duration_s, 0);
  for (int i = 0; i < 12; ++i) {
    EXPECT_TRUE(r.outputs[i].success) << r.outputs[i].error;
    EXPECT_EQ(r.outputs[i].generated_text, prompt_text(i));
    EXPECT_GE(r.outputs[i].start_time, 0);  // relative to the run's start
    EXPECT_LE(r.outputs[i].start_time, r.duration_s);
    EXPECT_GE(r.outputs[i].queue_time, 0);
  }
  const std::vector<std::string> ids = backend.ids();
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), 12u);
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).count("bench-x-11"), 1u);
}

TEST(Runner, OneAtATimeWithConcurrencyOne) {
  FakeBackend backend;
  RunOptions options;
  options.max_concurrency = 1;
  options.request_rate = 200;  // arrivals spread over 4 / 200 s
  const RunResult r = run_benchmark(backend, prompts(4), RequestSettings{}, options);
  EXPECT_EQ(backend.max_in_flight(), 1);
  for (const RequestOutput& o : r.outputs) EXPECT_TRUE(o.success) << o.error;
}

TEST(Runner, WarmupsAreSentButNotMeasured) {
  FakeBackend backend;
  RequestSettings settings;
  settings.request_id_prefix = "b-";
  RunOptions options;
  options.num_warmups = 3;
  const RunResult r = run_benchmark(backend, prompts(2), settings, options);
  EXPECT_EQ(r.outputs.size(), 2u);
  EXPECT_EQ(r.warmup_failures, 0);
  const std::vector<std::string> ids = backend.ids();
  EXPECT_EQ(ids.size(), 5u);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), "b-warmup-2"), 1);
}

TEST(Runner, MisbehavingRequestsFailAlone) {
  FakeBackend backend;
  std::vector<BenchPrompt> p = prompts(4);
  p[1].text = "short";
  p[2].text = "throw";
  const RunResult r = run_benchmark(backend, p, RequestSettings{}, RunOptions{});
  EXPECT_TRUE(r.outputs[0].success);
  EXPECT_FALSE(r.outputs[1].success);
  EXPECT_NE(r.outputs[1].error.find("generated 3 tokens, expected 4"), std::string::npos);
  EXPECT_FALSE(r.outputs[2].success);
  EXPECT_NE(r.outputs[2].error.find("backend bug"), std::string::npos);
  EXPECT_TRUE(r.outputs[3].success);
}

TEST(Runner, RejectsBadOptions) {
  FakeBackend backend;
  RunOptions options;
  options.max_concurrency = 0;
  EXPECT_THROW(run_benchmark(backend, prompts(2), RequestSettings{}, options), Error);
  EXPECT_THROW(run_benchmark(backend, {}, RequestSettings{}, RunOptions{}), Error);
}

// Records each request's prompt (history included) before answering like FakeBackend.
class RecordingBackend : public FakeBackend {
 public:
  RequestOutput send(const BenchPrompt& prompt, const RequestSettings& settings,
                     const std::string& request_id) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      sent_[prompt.text] = prompt;
    }
    return FakeBackend::send(prompt, settings, request_id);
  }
  BenchPrompt sent(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    return sent_.at(text);
  }

 private:
  std::mutex mutex_;
  std::map<std::string, BenchPrompt> sent_;
};

TEST(Runner, MultiTurnSendsHistoryInOrderWithinTheConcurrencyLimit) {
  RecordingBackend backend;
  RunOptions options;
  options.turns = 3;
  options.max_concurrency = 2;
  const RunResult r = run_benchmark(backend, prompts(12), RequestSettings{}, options);  // 4 x 3
  ASSERT_EQ(r.outputs.size(), 12u);
  EXPECT_LE(backend.max_in_flight(), 2);
  for (int c = 0; c < 4; ++c) {
    std::vector<std::string> expected;
    for (int k = 0; k < 3; ++k) {
      const int i = c * 3 + k;
      const RequestOutput& o = r.outputs[i];
      EXPECT_TRUE(o.success) << o.error;
      EXPECT_EQ(o.turn, k);
      const BenchPrompt sent = backend.sent(prompt_text(i));
      EXPECT_EQ(sent.history, expected) << "conversation " << c << " turn " << k;
      EXPECT_EQ(sent.prompt_len, k == 0 ? 10 : 0);  // later turns' totals are not checked
      if (k > 0) {
        const RequestOutput& previous = r.outputs[i - 1];
        EXPECT_GE(o.start_time, previous.start_time + previous.latency);
        EXPECT_EQ(o.queue_time, 0);
      }
      expected.push_back(prompt_text(i));
      expected.push_back(o.generated_text);  // the fake answers with the prompt's text
    }
  }
}

TEST(Runner, AFailedTurnFailsTheRestOfItsConversation) {
  FakeBackend backend;
  std::vector<BenchPrompt> p = prompts(6);
  p[1].text = "throw";
  RunOptions options;
  options.turns = 3;
  const RunResult r = run_benchmark(backend, p, RequestSettings{}, options);
  EXPECT_TRUE(r.outputs[0].success);
  EXPECT_FALSE(r.outputs[1].success);
  EXPECT_FALSE(r.outputs[2].success);
  EXPECT_NE(r.outputs[2].error.find("turn 1 of this conversation failed"), std::string::npos);
  for (int i = 3; i < 6; ++i) EXPECT_TRUE(r.outputs[i].success) << r.outputs[i].error;
  EXPECT_EQ(backend.ids().size(), 5u);  // the failed conversation's last turn was never sent
  EXPECT_THROW(run_benchmark(backend, prompts(4), RequestSettings{}, options), Error);
}

}  // namespace
}  // namespace attnres::bench
