#include "engine/sample/logits_processors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "test_logits.h"

namespace attnres {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(LogitBiasTest, AddsToListedTokensOnly) {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  apply_logit_bias(logits, {{0, -100.0f}, {2, 0.5f}});
  EXPECT_EQ(logits, (std::vector<float>{-99.0f, 2.0f, 3.5f}));
}

TEST(BlockTokensTest, SetsNegativeInfinity) {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f};
  const std::vector<int32_t> ids = {2};
  block_tokens(logits, ids);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, 2.0f, -kInf}));
}

TEST(PenaltiesTest, HandComputed) {
  std::vector<float> logits = {2.0f, -2.0f, 1.0f, 0.5f, 3.0f};
  const std::vector<int32_t> prompt = {0, 1, 0};
  const std::vector<int32_t> output = {1, 2, 2};
  PenaltyScratch scratch;
  apply_penalties(logits, prompt, output, {2.0f, 0.5f, 0.25f}, scratch);
  // Repetition (once per distinct token of prompt + output): 0: 2/2, 1: -2*2, 2: 1/2.
  // Then output-only: 1 (count 1): -4 - 0.25 - 0.5; 2 (count 2): 0.5 - 0.5 - 0.5.
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -4.75f, -0.5f, 0.5f, 3.0f}));
}

TEST(PenaltiesTest, MatchesBruteForceAndLeavesScratchClean) {
  const size_t vocab = 300;
  const std::vector<float> original = testing::random_logits(vocab, 3.0f, 1);
  std::vector<int32_t> prompt, output;
  std::mt19937 rng(2);
  for (int i = 0; i < 200; ++i) prompt.push_back(rng() % 100);
  for (int i = 0; i < 150; ++i) output.push_back(50 + rng() % 100);
  const PenaltyParams pen{1.3f, 0.4f, -0.3f};

  std::vector<float> expected = original;
  for (size_t t = 0; t < vocab; ++t) {
    const auto in = [&](const std::vector<int32_t>& v) {
      return std::count(v.begin(), v.end(), static_cast<int32_t>(t));
    };
    if (in(prompt) + in(output) > 0) {
      expected[t] = expected[t] > 0 ? expected[t] / pen.repetition : expected[t] * pen.repetition;
    }
    if (const auto count = in(output); count > 0) {
      expected[t] -= pen.frequency * static_cast<float>(count);
      expected[t] -= pen.presence;
    }
  }
  PenaltyScratch scratch;
  for (int call = 0; call < 2; ++call) {  // the second call proves the scratch was reset
    std::vector<float> logits = original;
    apply_penalties(logits, prompt, output, pen, scratch);
    EXPECT_EQ(logits, expected) << "call " << call;
  }
}

TEST(PenaltiesTest, DefaultsAreANoOp) {
  std::vector<float> logits = {1.0f, -1.0f};
  const std::vector<int32_t> ids = {0, 1};
  PenaltyScratch scratch;
  apply_penalties(logits, ids, ids, {}, scratch);
  EXPECT_EQ(logits, (std::vector<float>{1.0f, -1.0f}));
  EXPECT_TRUE(scratch.seen.empty());  // no vocabulary-sized allocation when inactive
}

TEST(TemperatureTest, DividesAndSanitisesNan) {
  std::vector<float> logits = {1.0f, -3.0f, NAN, -kInf};
  apply_temperature(logits, 0.5f);
  EXPECT_EQ(logits, (std::vector<float>{2.0f, -6.0f, -kInf, -kInf}));
}

TEST(ArgmaxTest, LowestIdWinsTies) {
  EXPECT_EQ(argmax(std::vector<float>{1.0f, 5.0f, 2.0f, 5.0f}), 1);
  EXPECT_EQ(argmax(std::vector<float>{NAN, 0.0f, 3.0f, NAN}), 2);
  EXPECT_EQ(argmax(std::vector<float>{-kInf, -kInf}), 0);
}

TEST(ArgmaxTest, MatchesStdMaxElementOnRandomLogits) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const auto logits = testing::random_logits(50000, 4.0f, seed);
    EXPECT_EQ(argmax(logits), std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
}

}  // namespace
}  // namespace attnres
