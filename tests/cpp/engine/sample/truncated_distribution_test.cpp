#include "engine/sample/truncated_distribution.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "test_logits.h"

namespace attnres {
namespace {

// Brute force, in double, straight from the definitions: sort everything; top-k keeps the k
// best; top-p keeps the smallest prefix of the renormalised distribution whose mass >= top_p;
// min-p drops tokens below min_p times the best probability.
std::map<int32_t, double> reference(const std::vector<float>& logits, const TruncationParams& p) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < order.size()) order.resize(p.top_k);
  auto normalised = [&] {
    std::vector<double> probs;
    double sum = 0.0;
    for (int32_t id : order) sum += std::exp(static_cast<double>(logits[id]) - logits[order[0]]);
    for (int32_t id : order) {
      probs.push_back(std::exp(static_cast<double>(logits[id]) - logits[order[0]]) / sum);
    }
    return probs;
  };
  if (p.top_p < 1.0f) {
    const auto probs = normalised();
    double mass = 0.0;
    size_t keep = 0;
    while (keep < order.size() && (keep == 0 || mass < p.top_p)) mass += probs[keep++];
    order.resize(keep);
  }
  if (p.min_p > 0.0f) {
    const auto probs = normalised();
    size_t keep = 0;
    while (keep < order.size() && probs[keep] >= p.min_p * probs[0]) ++keep;
    order.resize(keep);
  }
  std::map<int32_t, double> out;
  const auto probs = normalised();
  for (size_t i = 0; i < order.size(); ++i) {
    if (probs[i] > 0.0) out[order[i]] = probs[i];
  }
  return out;
}

std::map<int32_t, double> built(std::vector<float> logits, const TruncationParams& p) {
  TruncatedDistribution dist;
  dist.build(logits, p);
  const auto probs = dist.probabilities();
  return {probs.begin(), probs.end()};
}

void expect_matches_reference(const std::vector<float>& logits, const TruncationParams& p) {
  const auto expected = reference(logits, p);
  const auto actual = built(logits, p);
  ASSERT_EQ(actual.size(), expected.size())
      << "top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p;
  for (const auto& [id, prob] : expected) {
    ASSERT_TRUE(actual.count(id)) << "token " << id << " missing";
    EXPECT_NEAR(actual.at(id), prob, 1e-6) << "token " << id;
  }
}

struct Shape {
  size_t vocab;
  float stddev;  // small: flat distribution (large top-p sets); large: peaked
};

TEST(TruncatedDistributionTest, EachProcessorAndCombinationMatchesBruteForce) {
  const std::vector<Shape> shapes = {{1000, 3.0f}, {1000, 0.05f}, {50000, 8.0f}, {50000, 1.0f}};
  const std::vector<TruncationParams> params = {
      {0, 1.0f, 0.0f},   {1, 1.0f, 0.0f},    {40, 1.0f, 0.0f}, {0, 0.9f, 0.0f},
      {0, 0.5f, 0.0f},   {0, 0.999f, 0.0f},  {0, 1e-6f, 0.0f}, {0, 1.0f, 0.05f},
      {0, 1.0f, 0.5f},   {0, 1.0f, 1.0f},    {40, 0.8f, 0.0f}, {40, 0.8f, 0.1f},
      {0, 0.95f, 0.02f}, {2000, 0.7f, 0.0f}, {-1, 0.6f, 0.0f}, {100000, 1.0f, 0.0f},
  };
  uint32_t seed = 10;
  for (const Shape& shape : shapes) {
    for (const TruncationParams& p : params) {
      SCOPED_TRACE("vocab " + std::to_string(shape.vocab) + " stddev " +
                   std::to_string(shape.stddev));
      expect_matches_reference(testing::random_logits(shape.vocab, shape.stddev, seed++), p);
    }
  }
}

TEST(TruncatedDistributionTest, TiesBreakTowardsLowerIds) {
  // Integer logits: many exact ties at every cut-off.
  auto logits = testing::random_logits(5000, 2.0f, 99);
  for (float& l : logits) l = std::round(l);
  for (const TruncationParams& p : std::vector<TruncationParams>{
           {7, 1.0f, 0.0f}, {300, 1.0f, 0.0f}, {0, 0.3f, 0.0f}, {0, 0.77f, 0.1f}}) {
    expect_matches_reference(logits, p);
  }
}

TEST(TruncatedDistributionTest, TopPKeepsAtLeastTheBestToken) {
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f};
  const auto kept = built(logits, {0, 1e-6f, 0.0f});
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept.begin()->first, 0);
  EXPECT_DOUBLE_EQ(kept.begin()->second, 1.0);
}

TEST(TruncatedDistributionTest, TopPCutsAtHandComputedBoundary) {
  // Probabilities 0.5, 0.25, 0.125, 0.125 (logits are log2 multiples).
  const float l2 = std::log(2.0f);
  const std::vector<float> logits = {0.0f, -l2, -2 * l2, -2 * l2};
  EXPECT_EQ(built(logits, {0, 0.45f, 0.0f}).size(), 1u);  // 0.5 reaches 0.45
  EXPECT_EQ(built(logits, {0, 0.55f, 0.0f}).size(), 2u);  // needs 0.75
  EXPECT_EQ(built(logits, {0, 0.8f, 0.0f}).size(), 3u);   // needs 0.875
  EXPECT_EQ(built(logits, {0, 0.9f, 0.0f}).size(), 4u);
  EXPECT_EQ(built(logits, {0, 1.0f, 0.3f}).size(), 2u);  // min-p: 0.25 >= 0.15 > 0.125
}

TEST(TruncatedDistributionTest, TopPExactlyReachedStopsThere) {
  // Four equal tokens (exact weights 1): two of them hold exactly 0.5, so top_p 0.5 keeps two,
  // as vLLM's mask "ascending cumsum <= 1 - top_p" does.
  const std::vector<float> logits = {0.0f, 0.0f, 0.0f, 0.0f};
  const auto kept = built(logits, {0, 0.5f, 0.0f});
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept.begin()->first, 0);
  EXPECT_EQ(kept.rbegin()->first, 1);
}

TEST(TruncatedDistributionTest, BlockedTokensNeverKept) {
  std::vector<float> logits = {-INFINITY, 1.0f, -INFINITY, 0.0f};
  for (const TruncationParams& p :
       std::vector<TruncationParams>{{0, 1.0f, 0.0f}, {3, 1.0f, 0.0f}, {0, 0.99f, 0.0f}}) {
    const auto kept = built(logits, p);
    EXPECT_EQ(kept.count(0), 0u);
    EXPECT_EQ(kept.count(2), 0u);
  }
}

TEST(TruncatedDistributionTest, InverseCdfWalksDescendingOrder) {
  const float l2 = std::log(2.0f);
  std::vector<float> logits = {-2 * l2, 0.0f, -l2, -2 * l2};  // 0.125, 0.5, 0.25, 0.125
  TruncatedDistribution dist;
  dist.build(logits, {3, 1.0f, 0.0f});  // top-k 3: tokens 1, 2, 0 (tie with 3 -> lower id)
  EXPECT_EQ(dist.sample(0.0), 1);
  EXPECT_EQ(dist.sample(0.49), 1);
  EXPECT_EQ(dist.sample(0.5 / 0.875 + 1e-9), 2);
  EXPECT_EQ(dist.sample(0.9999999), 0);

  std::vector<float> all = {-2 * l2, 0.0f, -l2, -2 * l2};
  dist.build(all, {0, 1.0f, 0.0f});  // no truncation: walks token ids in order
  EXPECT_EQ(dist.sample(0.0), 0);
  EXPECT_EQ(dist.sample(0.126), 1);
  EXPECT_EQ(dist.sample(0.626), 2);
  EXPECT_EQ(dist.sample(0.9999), 3);
}

}  // namespace
}  // namespace attnres
