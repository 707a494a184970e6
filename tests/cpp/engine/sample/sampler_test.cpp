#include "engine/sample/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "test_logits.h"

namespace attnres {
namespace {

const std::vector<int32_t> kNoIds;

int32_t sample_once(Sampler& sampler, std::vector<float> logits,
                    const std::vector<int32_t>& output = kNoIds,
                    const std::vector<int32_t>& eos = kNoIds, TokenLogprob* lp = nullptr) {
  return sampler.sample(logits, kNoIds, output, eos, lp);
}

std::vector<int32_t> generate(Sampler& sampler, const std::vector<float>& logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(sample_once(sampler, logits));
  return out;
}

// Pearson chi-square of `counts` against probabilities `expected`; a token outside `expected`
// makes it infinite.
double chi_square(const std::map<int32_t, int>& counts, const std::map<int32_t, double>& expected,
                  int draws) {
  double chi2 = 0.0;
  for (const auto& [id, count] : counts) {
    if (!expected.count(id)) return INFINITY;
  }
  for (const auto& [id, p] : expected) {
    const double e = p * draws;
    const double o = counts.count(id) ? counts.at(id) : 0;
    chi2 += (o - e) * (o - e) / e;
  }
  return chi2;
}

std::map<int32_t, double> softmax(const std::vector<float>& logits, float temperature) {
  double sum = 0.0;
  for (float l : logits) sum += std::exp(l / temperature);
  std::map<int32_t, double> out;
  for (size_t i = 0; i < logits.size(); ++i) out[i] = std::exp(logits[i] / temperature) / sum;
  return out;
}

TEST(SamplerTest, GreedyIsArgmaxOfProcessedLogits) {
  SamplingParams p;
  p.temperature = 0.0f;
  Sampler sampler(p, 0);
  for (uint32_t seed = 0; seed < 10; ++seed) {
    const auto logits = testing::random_logits(30000, 3.0f, seed);
    EXPECT_EQ(sample_once(sampler, logits),
              std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  EXPECT_EQ(sample_once(sampler, {1.0f, 4.0f, 4.0f}), 1);  // ties: lowest id

  p.logit_bias = {{0, 10.0f}};  // processing happens before the argmax
  Sampler biased(p, 0);
  EXPECT_EQ(sample_once(biased, {1.0f, 4.0f, 4.0f}), 0);
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedsDiffer) {
  const auto logits = testing::random_logits(1000, 1.0f, 5);
  SamplingParams p;
  p.seed = 1234;
  Sampler a(p, 1), b(p, 2);  // the fallback seed is unused when a seed is given
  const auto seq_a = generate(a, logits, 64);
  EXPECT_EQ(seq_a, generate(b, logits, 64));
  p.seed = 1235;
  Sampler c(p, 1);
  EXPECT_NE(seq_a, generate(c, logits, 64));

  p.seed.reset();
  Sampler d(p, 1234), e(p, 77);
  EXPECT_EQ(generate(d, logits, 64), seq_a);  // unseeded: the fallback seeds the RNG
  EXPECT_NE(generate(e, logits, 64), seq_a);
}

TEST(SamplerTest, SeededSequenceIndependentOfInterleaving) {
  // Batching interleaves sequences; each sampler's own RNG must make that invisible.
  const auto logits = testing::random_logits(500, 1.0f, 6);
  SamplingParams p;
  p.seed = 42;
  p.top_k = 50;
  p.top_p = 0.9f;
  Sampler alone(p, 0);
  const auto expected = generate(alone, logits, 32);
  Sampler interleaved(p, 0), other(SamplingParams{}, 9);
  std::vector<int32_t> got;
  for (int i = 0; i < 32; ++i) {
    for (int j = 0; j < i % 3; ++j) sample_once(other, logits);
    got.push_back(sample_once(interleaved, logits));
  }
  EXPECT_EQ(got, expected);
}

TEST(SamplerTest, TemperatureOneFollowsSoftmax) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, 1.2f, -3.0f, 0.3f, 1.9f};
  SamplingParams p;
  p.seed = 7;
  Sampler sampler(p, 0);
  const int draws = 200000;
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[sample_once(sampler, logits)];
  // 7 degrees of freedom: P(chi2 > 30) is about 1e-4. Sampling uniformly instead would give
  // a chi-square in the tens of thousands.
  EXPECT_LT(chi_square(counts, softmax(logits, 1.0f), draws), 30.0);
}

TEST(SamplerTest, TemperatureAndTruncationFollowTheTruncatedSoftmax) {
  const std::vector<float> logits = {0.5f, -1.0f, 2.0f, 0.0f, 1.2f, -3.0f, 0.3f, 1.9f};
  SamplingParams p;
  p.seed = 8;
  p.temperature = 0.7f;
  p.top_k = 5;      // keeps 2, 7, 4, 0, 6
  p.top_p = 0.85f;  // then drops the tail of those
  Sampler sampler(p, 0);
  // Expected: softmax at T over the top 5, cut to the smallest prefix reaching 0.85.
  const std::vector<int32_t> order = {2, 7, 4, 0, 6};
  double z = 0.0;
  for (int32_t id : order) z += std::exp(logits[id] / p.temperature);
  std::map<int32_t, double> expected;
  double mass = 0.0;
  for (int32_t id : order) {
    if (mass >= p.top_p) break;
    expected[id] = std::exp(logits[id] / p.temperature) / z;
    mass += expected[id];
  }
  for (auto& [id, prob] : expected) prob /= mass;
  ASSERT_LT(expected.size(), 5u);  // the test must exercise the top-p cut
  const int draws = 100000;
  std::map<int32_t, int> counts;
  for (int i = 0; i < draws; ++i) ++counts[sample_once(sampler, logits)];
  EXPECT_LT(chi_square(counts, expected, draws), 25.0);
}

TEST(SamplerTest, MinTokensBlocksEosAndStopTokenIds) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.min_tokens = 3;
  p.stop_token_ids = {1};
  Sampler sampler(p, 0);
  const std::vector<float> logits = {9.0f, 8.0f, 1.0f, 7.0f};  // EOS 0 > stop id 1 > token 3
  const std::vector<int32_t> eos = {0};
  std::vector<int32_t> output;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(sample_once(sampler, logits, output, eos), 3) << "output size " << i;
    output.push_back(3);
  }
  EXPECT_EQ(sample_once(sampler, logits, output, eos), 0);  // min_tokens reached
}

TEST(SamplerTest, PenaltiesUseOutputAndPrompt) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = 2.0f;
  Sampler sampler(p, 0);
  const std::vector<float> logits = {3.0f, 2.0f};
  EXPECT_EQ(sample_once(sampler, logits, {0}), 1);  // 3 - 2 < 2
  p.presence_penalty = 0.0f;
  p.repetition_penalty = 2.0f;
  Sampler rep(p, 0);
  std::vector<float> copy = logits;
  const std::vector<int32_t> prompt = {0};
  EXPECT_EQ(rep.sample(copy, prompt, kNoIds, kNoIds, nullptr), 1);  // 3 / 2 < 2
}

TEST(SamplerTest, LogprobsComeFromRawLogits) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.logprobs = 2;
  p.logit_bias = {{3, 50.0f}};
  Sampler sampler(p, 0);
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.0f};
  TokenLogprob lp;
  EXPECT_EQ(sample_once(sampler, logits, kNoIds, kNoIds, &lp), 3);
  double z = 0.0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(lp.logprob, 0.0 - std::log(z), 1e-6);  // unbiased logit 0
  EXPECT_EQ(lp.rank, 4);
  ASSERT_EQ(lp.top.size(), 2u);
  EXPECT_EQ(lp.top[0].first, 1);
  EXPECT_NEAR(lp.top[0].second, 3.0 - std::log(z), 1e-6);
  EXPECT_EQ(lp.top[1].first, 2);

  p.logprobs = -1;  // not requested: output left untouched
  Sampler quiet(p, 0);
  TokenLogprob untouched;
  sample_once(quiet, logits, kNoIds, kNoIds, &untouched);
  EXPECT_EQ(untouched.token_id, -1);
}

}  // namespace
}  // namespace attnres
