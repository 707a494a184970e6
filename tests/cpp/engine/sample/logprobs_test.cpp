#include "engine/sample/logprobs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "test_logits.h"

namespace attnres {
namespace {

std::vector<double> reference_log_softmax(const std::vector<float>& logits) {
  double max = -INFINITY;
  for (float l : logits) max = std::max<double>(max, l);
  double sum = 0.0;
  for (float l : logits) sum += std::exp(static_cast<double>(l) - max);
  std::vector<double> out;
  for (float l : logits) out.push_back(static_cast<double>(l) - max - std::log(sum));
  return out;
}

TEST(LogprobsTest, MatchesDoublePrecisionLogSoftmax) {
  // A large offset would overflow a naive exp(logit): checks the max shift.
  for (float mean : {0.0f, 1000.0f, -1000.0f}) {
    const auto logits = testing::random_logits(20000, 5.0f, 3, mean);
    const auto ref = reference_log_softmax(logits);
    std::vector<int32_t> order(logits.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    for (int32_t chosen : {0, 17, order[0], order[5], order.back()}) {
      const TokenLogprob lp = compute_logprobs(logits, chosen, 5);
      EXPECT_EQ(lp.token_id, chosen);
      EXPECT_NEAR(lp.logprob, ref[chosen], 1e-4 * std::max(1.0, std::abs(ref[chosen])));
      const auto rank =
          std::count_if(logits.begin(), logits.end(), [&](float l) { return l >= logits[chosen]; });
      EXPECT_EQ(lp.rank, rank);
      ASSERT_EQ(lp.top.size(), 5u);
      for (size_t i = 0; i < 5; ++i) {
        EXPECT_EQ(lp.top[i].first, order[i]);
        EXPECT_NEAR(lp.top[i].second, ref[order[i]], 1e-4);
      }
    }
  }
}

TEST(LogprobsTest, RankAndTiesFollowVllm) {
  const std::vector<float> logits = {1.0f, 3.0f, 3.0f, 2.0f};
  const TokenLogprob lp = compute_logprobs(logits, 1, 3);
  EXPECT_EQ(lp.rank, 2);  // vLLM counts tokens with logprob >= the chosen one
  ASSERT_EQ(lp.top.size(), 3u);
  EXPECT_EQ(lp.top[0].first, 1);
  EXPECT_EQ(lp.top[1].first, 2);
  EXPECT_EQ(lp.top[2].first, 3);
  EXPECT_EQ(compute_logprobs(logits, 3, 0).top.size(), 0u);
  EXPECT_EQ(compute_logprobs(logits, 3, 0).rank, 3);
}

}  // namespace
}  // namespace attnres
