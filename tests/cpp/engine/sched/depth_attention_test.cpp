// Depth-attention introspection in the engine loop, with the fake forward's weights (a
// checksum of each row's context, fake_model.h): the prompt mean covers every prompt position
// exactly once across chunked prefill and preemption by recompute, is sent once per choice
// with its first output, and per-token weights come from the forward that produced each token.
// Requests that do not ask cost no depth rows; a runner without a layout refuses them.
#include <gtest/gtest.h>

#include <cmath>

#include "engine_test_util.h"

namespace attnres::testing {
namespace {

constexpr int kRows = 5, kCols = 3;

EngineRequest depth_request(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
                            bool per_token) {
  EngineRequest request = greedy_request(id, std::move(prompt), max_tokens);
  request.params.depth_attention = !per_token;  // per_token alone implies the mean
  request.params.depth_attention_per_token = per_token;
  return request;
}

// The fake weights of the forward whose context is `context`, as a matrix.
DepthAttentionMatrix weights_of(std::span<const int32_t> context) {
  DepthAttentionMatrix m{kRows, kCols, {}};
  for (int k = 0; k < kRows; ++k)
    for (int c = 0; c < kCols; ++c) m.values.push_back(fake_depth_weight(context, k, c, kCols));
  return m;
}

// Mean over prompt positions p of the weights of context prompt[0..p].
DepthAttentionMatrix expected_mean(const std::vector<int32_t>& prompt) {
  std::vector<double> sum(kRows * kCols, 0.0);
  for (size_t p = 0; p < prompt.size(); ++p) {
    const DepthAttentionMatrix m = weights_of(std::span(prompt).first(p + 1));
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += m.values[i];
  }
  DepthAttentionMatrix mean{kRows, kCols, {}};
  for (double s : sum) mean.values.push_back(static_cast<float>(s / prompt.size()));
  return mean;
}

void expect_matrix(const DepthAttentionMatrix& got, const DepthAttentionMatrix& want,
                   const std::string& what) {
  ASSERT_EQ(got.rows, want.rows) << what;
  ASSERT_EQ(got.cols, want.cols) << what;
  ASSERT_EQ(got.values.size(), want.values.size()) << what;
  for (size_t i = 0; i < want.values.size(); ++i) {
    if (std::isnan(want.values[i])) {
      EXPECT_TRUE(std::isnan(got.values[i])) << what << " cell " << i;
    } else {
      EXPECT_NEAR(got.values[i], want.values[i], 1e-6) << what << " cell " << i;
    }
  }
}

struct DepthRead {
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, int> means_sent;  // per choice
  std::map<int, bool> mean_with_first_output;
  std::map<int, DepthAttentionMatrix> mean;
  std::map<int, std::vector<DepthAttentionMatrix>> per_token;
  bool one_matrix_per_token = true;
};

DepthRead read_depth(RequestStream& stream) {
  DepthRead r;
  std::map<int, int> outputs;
  while (std::optional<RequestOutput> out = stream.next()) {
    const int i = out->choice_index;
    if (out->depth_prompt_mean) {
      r.means_sent[i] += 1;
      r.mean[i] = *out->depth_prompt_mean;
      r.mean_with_first_output[i] = outputs[i] == 0;
    }
    if (!out->depth_per_token.empty() && out->depth_per_token.size() != out->token_ids.size()) {
      r.one_matrix_per_token = false;
    }
    outputs[i] += 1;
    r.tokens[i].insert(r.tokens[i].end(), out->token_ids.begin(), out->token_ids.end());
    r.per_token[i].insert(r.per_token[i].end(), out->depth_per_token.begin(),
                          out->depth_per_token.end());
  }
  return r;
}

// Checks one choice: its mean, and token k's weights = those of context prompt + tokens[0..k).
void expect_choice(const DepthRead& r, int choice, const std::vector<int32_t>& prompt,
                   bool per_token, const std::string& what) {
  ASSERT_EQ(r.means_sent.count(choice), 1u) << what;
  EXPECT_EQ(r.means_sent.at(choice), 1) << what;
  EXPECT_TRUE(r.mean_with_first_output.at(choice)) << what;
  expect_matrix(r.mean.at(choice), expected_mean(prompt), what + " prompt mean");
  const std::vector<int32_t>& tokens = r.tokens.at(choice);
  const auto it = r.per_token.find(choice);
  const size_t matrices = it == r.per_token.end() ? 0 : it->second.size();
  if (!per_token) {
    EXPECT_EQ(matrices, 0u) << what;
    return;
  }
  ASSERT_EQ(matrices, tokens.size()) << what;
  std::vector<int32_t> context = prompt;
  for (size_t k = 0; k < tokens.size(); ++k) {
    expect_matrix(it->second[k], weights_of(context), what + " token " + std::to_string(k));
    context.push_back(tokens[k]);
  }
}

TEST(DepthAttention, PromptMeanAcrossChunksAndPerTokenWeights) {
  FakeRunner runner(64, 4);
  runner.set_depth_layout(kRows, kCols);
  // A budget of 4 tokens splits the 10-token prompt into chunks of 4, 4 and 2.
  EngineCore engine(engine_config({.max_num_batched_tokens = 4}), runner);
  EXPECT_EQ(engine.depth_attention_layout().rows(), kRows);
  const std::vector<int32_t> prompt = iota_prompt(10, 5);
  SubmitResult submitted = engine.submit(depth_request("r1", prompt, 3, /*per_token=*/true));
  ASSERT_TRUE(submitted.accepted()) << submitted.message;
  run_until_idle(engine);
  const DepthRead r = read_depth(*submitted.stream);
  // Prompt rows 4 + 4 + 2 (plus the sampling row of the last chunk), then one per decode.
  EXPECT_EQ(runner.depth_row_counts(), (std::vector<int>{4, 4, 3, 1, 1}));
  EXPECT_EQ(r.tokens.at(0), reference_tokens(prompt, 3));
  EXPECT_TRUE(r.one_matrix_per_token);
  expect_choice(r, 0, prompt, true, "chunked");
}

TEST(DepthAttention, PromptMeanOnlyAsksForPromptRows) {
  FakeRunner runner(64, 4);
  runner.set_depth_layout(kRows, kCols);
  EngineCore engine(engine_config({.max_num_batched_tokens = 4}), runner);
  const std::vector<int32_t> prompt = iota_prompt(6, 2);
  SubmitResult submitted = engine.submit(depth_request("r1", prompt, 3, /*per_token=*/false));
  run_until_idle(engine);
  const DepthRead r = read_depth(*submitted.stream);
  EXPECT_EQ(runner.depth_row_counts(), (std::vector<int>{4, 2, 0, 0}));
  expect_choice(r, 0, prompt, false, "mean only");
}

TEST(DepthAttention, RequestsWithoutItCostNoDepthRows) {
  FakeRunner runner(64, 4);
  runner.set_depth_layout(kRows, kCols);
  EngineCore engine(engine_config({}), runner);
  SubmitResult submitted = engine.submit(greedy_request("r1", iota_prompt(7, 1), 3));
  run_until_idle(engine);
  const DepthRead r = read_depth(*submitted.stream);
  EXPECT_EQ(runner.depth_row_counts(), (std::vector<int>{0, 0, 0}));
  EXPECT_TRUE(r.means_sent.empty());
  EXPECT_TRUE(r.per_token.empty() || r.per_token.at(0).empty());
}

TEST(DepthAttention, EveryChoiceGetsItsOwn) {
  FakeRunner runner(64, 4);
  runner.set_depth_layout(kRows, kCols);
  runner.set_smooth_logits(true);  // seeded sampling: the choices generate different tokens
  EngineCore engine(engine_config({}), runner);
  EngineRequest request = depth_request("r1", iota_prompt(5, 3), 4, /*per_token=*/true);
  request.params.temperature = 1.0f;
  request.params.seed = 11;
  request.n = 3;
  SubmitResult submitted = engine.submit(std::move(request));
  run_until_idle(engine);
  const DepthRead r = read_depth(*submitted.stream);
  for (int choice = 0; choice < 3; ++choice) {
    expect_choice(r, choice, iota_prompt(5, 3), true, numbered("choice ", choice));
  }
}

TEST(DepthAttention, PreemptionByRecomputeCountsNoPositionTwice) {
  FakeRunner runner(12, 4);
  runner.set_depth_layout(kRows, kCols);
  EngineCore engine(engine_config({.num_blocks = 12, .max_num_batched_tokens = 6}), runner);
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int i = 0; i < 8; ++i) {
    SubmitResult r = engine.submit(
        depth_request(numbered("r", i), iota_prompt(4 + i, i), 12, /*per_token=*/i % 2 == 0));
    ASSERT_TRUE(r.accepted()) << r.message;
    streams.push_back(std::move(r.stream));
  }
  run_until_idle(engine);
  EXPECT_GT(engine.stats().preemptions_total, 0);
  for (int i = 0; i < 8; ++i) {
    const DepthRead r = read_depth(*streams[i]);
    EXPECT_EQ(r.tokens.at(0), reference_tokens(iota_prompt(4 + i, i), 12)) << i;
    expect_choice(r, 0, iota_prompt(4 + i, i), i % 2 == 0, numbered("r", i));
  }
}

TEST(DepthAttention, RefusedWhenTheModelHasNone) {
  FakeRunner runner(64, 4);  // no layout: like a plain model
  EngineCore engine(engine_config({}), runner);
  for (bool per_token : {false, true}) {
    SubmitResult r = engine.submit(depth_request("r1", iota_prompt(4, 0), 2, per_token));
    EXPECT_EQ(r.status, SubmitStatus::InvalidRequest);
    EXPECT_NE(r.message.find("no depth attention"), std::string::npos) << r.message;
  }
}

}  // namespace
}  // namespace attnres::testing
