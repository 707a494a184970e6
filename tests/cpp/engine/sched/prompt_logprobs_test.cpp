// Prompt logprobs (vLLM's prompt_logprobs) in the engine loop: a logit row for every prompt
// token but the last (which is the sampling row), correct values across chunked prefill, sent
// exactly once per choice (with its first output) even when preemption recomputes the
// prompt, and no extra rows for requests that do not ask.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "engine/sample/logprobs.h"
#include "engine_test_util.h"

namespace attnres::testing {
namespace {

EngineRequest prompt_logprobs_request(const std::string& id, std::vector<int32_t> prompt,
                                      int max_tokens, int k) {
  EngineRequest request = greedy_request(id, std::move(prompt), max_tokens);
  request.params.prompt_logprobs = k;
  return request;
}

// What position p's entry must be: the fake model's row after prompt[0..p) scored at prompt[p].
void expect_prompt_logprobs(const FakeRunner& runner, const std::vector<int32_t>& prompt,
                            const std::vector<std::optional<TokenLogprob>>& got, int k,
                            const std::string& what) {
  ASSERT_EQ(got.size(), prompt.size()) << what;
  EXPECT_FALSE(got[0].has_value()) << what;
  for (size_t p = 1; p < prompt.size(); ++p) {
    ASSERT_TRUE(got[p].has_value()) << what << " position " << p;
    const std::vector<int32_t> context(prompt.begin(), prompt.begin() + static_cast<long>(p));
    const std::vector<float> row = runner.logits_for(next_token(context));
    const TokenLogprob want = compute_logprobs(row, prompt[p], k);
    EXPECT_EQ(got[p]->token_id, prompt[p]) << what << " position " << p;
    EXPECT_NEAR(got[p]->logprob, want.logprob, 1e-6) << what << " position " << p;
    EXPECT_EQ(got[p]->rank, want.rank) << what << " position " << p;
    EXPECT_EQ(got[p]->top, want.top) << what << " position " << p;
  }
}

struct Read {
  Collected collected;
  int outputs_with_prompt_logprobs = 0;
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  int choice = -1;                 // the choice the last of them came with
  bool with_first_output = false;  // the last of them
  std::map<int, bool> by_choice;   // choice -> they came with its first output
};

Read read_all(RequestStream& stream) {
  Read r;
  std::map<int, int> seen;
  while (std::optional<RequestOutput> out = stream.next()) {
    const int index = out->choice_index;
    if (!out->prompt_logprobs.empty()) {
      r.outputs_with_prompt_logprobs += 1;
      r.prompt_logprobs = out->prompt_logprobs;
      r.choice = index;
      r.with_first_output = seen[index] == 0;
      r.by_choice[index] = r.with_first_output;
    }
    seen[index] += 1;
    auto& tokens = r.collected.tokens[index];
    tokens.insert(tokens.end(), out->token_ids.begin(), out->token_ids.end());
    r.collected.last[index] = *out;
  }
  return r;
}

int total(const std::vector<int>& counts) {
  int sum = 0;
  for (int c : counts) sum += c;
  return sum;
}

TEST(PromptLogprobs, EveryPrefillTokenGetsARowAcrossChunksAndTheyAreSentOnce) {
  FakeRunner runner(64, 4);
  runner.set_smooth_logits(true);
  runner.set_allow_inner_rows(true);
  // A budget of 4 tokens splits the 10-token prompt into chunks of 4, 4 and 2.
  EngineCore engine(engine_config({.max_num_batched_tokens = 4}), runner);
  const std::vector<int32_t> prompt = iota_prompt(10, 5);
  SubmitResult submitted = engine.submit(prompt_logprobs_request("r1", prompt, 3, 2));
  ASSERT_TRUE(submitted.accepted()) << submitted.message;
  run_until_idle(engine);
  const Read r = read_all(*submitted.stream);

  // Prefill: rows for tokens 0..8 (positions 1..9) plus the sampling row; then 2 decodes.
  EXPECT_EQ(runner.logit_row_counts(), (std::vector<int>{4, 4, 2, 1, 1}));
  EXPECT_EQ(r.collected.tokens.at(0), reference_tokens(prompt, 3));
  EXPECT_EQ(r.outputs_with_prompt_logprobs, 1);
  EXPECT_TRUE(r.with_first_output);
  expect_prompt_logprobs(runner, prompt, r.prompt_logprobs, 2, "chunked");
}

TEST(PromptLogprobs, RequestsWithoutThemAskForNoExtraRows) {
  FakeRunner runner(64, 4);
  EngineCore engine(engine_config({.max_num_batched_tokens = 4}), runner);
  SubmitResult submitted = engine.submit(greedy_request("r1", iota_prompt(10, 5), 3));
  run_until_idle(engine);
  const Read r = read_all(*submitted.stream);
  EXPECT_EQ(runner.logit_row_counts(), (std::vector<int>{0, 0, 1, 1, 1}));
  EXPECT_EQ(r.outputs_with_prompt_logprobs, 0);
}

TEST(PromptLogprobs, AOneTokenPromptGetsOneNullEntry) {
  FakeRunner runner(64, 4);
  runner.set_allow_inner_rows(true);
  EngineCore engine(engine_config({}), runner);
  SubmitResult submitted = engine.submit(prompt_logprobs_request("r1", {7}, 2, 0));
  run_until_idle(engine);
  const Read r = read_all(*submitted.stream);
  EXPECT_EQ(total(runner.logit_row_counts()), 2);
  ASSERT_EQ(r.outputs_with_prompt_logprobs, 1);
  ASSERT_EQ(r.prompt_logprobs.size(), 1u);
  EXPECT_FALSE(r.prompt_logprobs[0].has_value());
}

TEST(PromptLogprobs, NChoicesEachSendThemWithTheirFirstOutput) {
  FakeRunner runner(64, 4);
  runner.set_allow_inner_rows(true);
  EngineCore engine(engine_config({}), runner);
  EngineRequest request = prompt_logprobs_request("r1", iota_prompt(6, 1), 2, 1);
  request.n = 3;
  SubmitResult submitted = engine.submit(std::move(request));
  run_until_idle(engine);
  const Read r = read_all(*submitted.stream);
  // Each choice computes them (no choice waits on a sibling): 5 prompt rows per choice, and
  // every choice samples 2 tokens.
  EXPECT_EQ(r.outputs_with_prompt_logprobs, 3);
  EXPECT_EQ(r.by_choice, (std::map<int, bool>{{0, true}, {1, true}, {2, true}}));
  EXPECT_EQ(total(runner.logit_row_counts()), 3 * 5 + 3 * 2);
  expect_prompt_logprobs(runner, iota_prompt(6, 1), r.prompt_logprobs, 1, "n = 3");
}

TEST(PromptLogprobs, PreemptionByRecomputeDoesNotSendThemAgain) {
  FakeRunner runner(12, 4);
  runner.set_allow_inner_rows(true);
  EngineCore engine(engine_config({.num_blocks = 12, .max_num_batched_tokens = 6}), runner);
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int i = 0; i < 8; ++i) {
    SubmitResult r =
        engine.submit(prompt_logprobs_request(numbered("r", i), iota_prompt(4 + i, i), 12, 3));
    ASSERT_TRUE(r.accepted()) << r.message;
    streams.push_back(std::move(r.stream));
  }
  run_until_idle(engine);
  for (int i = 0; i < 8; ++i) {
    const Read r = read_all(*streams[i]);
    EXPECT_EQ(r.collected.tokens.at(0), reference_tokens(iota_prompt(4 + i, i), 12)) << i;
    EXPECT_EQ(r.outputs_with_prompt_logprobs, 1) << i;
    EXPECT_TRUE(r.with_first_output) << i;
    expect_prompt_logprobs(runner, iota_prompt(4 + i, i), r.prompt_logprobs, 3, numbered("r", i));
  }
  EXPECT_GT(engine.stats().preemptions_total, 0);
}

TEST(PromptLogprobs, ValidatedLikeLogprobs) {
  FakeRunner runner(64, 4);
  EngineCore engine(engine_config({}), runner);
  SubmitResult r = engine.submit(prompt_logprobs_request("r1", iota_prompt(4, 0), 2, 21));
  EXPECT_EQ(r.status, SubmitStatus::InvalidRequest);
  EXPECT_NE(r.message.find("prompt_logprobs"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace attnres::testing
