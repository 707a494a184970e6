// Statistics against NumPy's values (computed with numpy 2 for the arrays written here) and
// vLLM's calculate_metrics on the hand-computed timeline of timeline.h.
#include <gtest/gtest.h>

#include "clients/bench/metrics.h"
#include "clients/bench/statistics.h"
#include "engine/core/error.h"
#include "tests/cpp/clients/bench/timeline.h"

namespace attnres::bench {
namespace {

using testing::hand_timeline;
using testing::ok;

// np.percentile(v, p) for v = [0.125, 3.5, 1.75, 9.0, 2.25, 0.5, 7.125] (NumPy's "linear").
TEST(Statistics, PercentilesMatchNumPy) {
  const std::vector<double> v = {0.125, 3.5, 1.75, 9.0, 2.25, 0.5, 7.125};
  EXPECT_DOUBLE_EQ(percentile(v, 0), 0.125);
  EXPECT_DOUBLE_EQ(percentile(v, 25), 1.125);
  EXPECT_DOUBLE_EQ(percentile(v, 50), 2.25);
  EXPECT_DOUBLE_EQ(percentile(v, 90), 7.875000000000001);
  EXPECT_DOUBLE_EQ(percentile(v, 99), 8.8875);
  EXPECT_DOUBLE_EQ(percentile(v, 99.9), 8.988750000000001);
  EXPECT_DOUBLE_EQ(percentile(v, 100), 9.0);
  const std::vector<double> even(v.begin(), v.begin() + 6);
  EXPECT_DOUBLE_EQ(percentile(even, 50), 2.0);
  EXPECT_DOUBLE_EQ(percentile(even, 99), 8.725000000000001);
  EXPECT_THROW(percentile(v, 101), Error);
  EXPECT_THROW(percentile(v, -1), Error);
}

TEST(Statistics, MeanMedianStdMatchNumPy) {
  const std::vector<double> v = {0.125, 3.5, 1.75, 9.0, 2.25, 0.5, 7.125};
  EXPECT_DOUBLE_EQ(mean(v), 3.4642857142857144);
  EXPECT_DOUBLE_EQ(median(v), 2.25);
  EXPECT_DOUBLE_EQ(median({0.125, 3.5, 1.75, 9.0, 2.25, 0.5}), 2.0);  // mean of the middle two
  EXPECT_DOUBLE_EQ(stddev(v), 3.1258672266056577);                    // population (ddof = 0)
}

// vLLM passes `values or 0`: an empty list reads as 0, not NaN.
TEST(Statistics, EmptyIsZero) {
  EXPECT_EQ(mean({}), 0);
  EXPECT_EQ(median({}), 0);
  EXPECT_EQ(stddev({}), 0);
  EXPECT_EQ(percentile({}, 99), 0);
}

TEST(Metrics, HandComputedTimeline) {
  const BenchmarkMetrics m = calculate_metrics(hand_timeline(), 2.0, {99});
  EXPECT_EQ(m.completed, 3);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input, 30);  // failed requests' prompts do not count
  EXPECT_EQ(m.total_output, 7);
  EXPECT_EQ(m.output_lens, (std::vector<int>{4, 2, 0, 1}));
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.5);
  EXPECT_DOUBLE_EQ(m.output_throughput, 3.5);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 18.5);

  // TTFT [0.5, 1.0, 0.25] s.
  const MetricSummary& ttft = m.summaries.at("ttft");
  EXPECT_NEAR(ttft.mean_ms, 1750.0 / 3, 1e-9);
  EXPECT_DOUBLE_EQ(ttft.median_ms, 500);
  EXPECT_NEAR(ttft.std_ms, 311.8047822311618, 1e-9);  // sqrt(0.0972222...) * 1000
  ASSERT_EQ(ttft.percentiles_ms.size(), 1u);
  EXPECT_EQ(ttft.percentiles_ms[0].first, 99);
  EXPECT_NEAR(ttft.percentiles_ms[0].second, 990, 1e-9);  // 0.5 + 0.98 * (1.0 - 0.5)

  // TPOT = (E2EL - TTFT) / (output - 1): A (1.5 - 0.5) / 3, B 0.5 / 1; D has one token: none.
  const MetricSummary& tpot = m.summaries.at("tpot");
  EXPECT_NEAR(tpot.mean_ms, (1000.0 / 3 + 500) / 2, 1e-9);
  EXPECT_NEAR(tpot.median_ms, (1000.0 / 3 + 500) / 2, 1e-9);

  // ITL: every gap of every request, [0.25, 0.25, 0.5, 0.5].
  const MetricSummary& itl = m.summaries.at("itl");
  EXPECT_DOUBLE_EQ(itl.mean_ms, 375);
  EXPECT_DOUBLE_EQ(itl.median_ms, 375);
  EXPECT_DOUBLE_EQ(itl.percentiles_ms[0].second, 500);

  const MetricSummary& e2el = m.summaries.at("e2el");
  EXPECT_NEAR(e2el.mean_ms, 3250.0 / 3, 1e-9);
  EXPECT_DOUBLE_EQ(e2el.median_ms, 1500);

  EXPECT_DOUBLE_EQ(m.max_output_tokens_per_s, 5);
  EXPECT_EQ(m.max_concurrent_requests, 3);
  EXPECT_EQ(m.summaries.count("client_queue_time"), 0u);  // only with --max-concurrency
}

// A request that ends exactly when another starts does not overlap it (half-open intervals,
// departures sorted before arrivals).
TEST(Metrics, PeakConcurrencyTreatsIntervalsAsHalfOpen) {
  const BenchmarkMetrics m =
      calculate_metrics({ok(0.0, 0.5, {0.5}, 1.0, 2), ok(1.0, 0.5, {0.5}, 1.0, 2)}, 2.0, {99});
  EXPECT_EQ(m.max_concurrent_requests, 1);
}

TEST(Metrics, QueueMetricsWhenAsked) {
  std::vector<RequestOutput> outs = {ok(0.0, 0.5, {}, 0.5, 1), ok(0.5, 0.5, {}, 0.5, 1)};
  outs[0].queue_time = 0.0;
  outs[1].queue_time = 0.5;
  const BenchmarkMetrics m = calculate_metrics(outs, 1.0, {50}, true, true);
  EXPECT_DOUBLE_EQ(m.summaries.at("client_queue_time").mean_ms, 250);
  EXPECT_DOUBLE_EQ(m.summaries.at("e2el_including_client_queue").mean_ms, 750);
  const BenchmarkMetrics burst = calculate_metrics(outs, 1.0, {50}, true, false);
  EXPECT_EQ(burst.summaries.count("e2el_including_client_queue"), 0u);
}

TEST(Metrics, AllFailedGivesZeros) {
  RequestOutput failed;
  failed.error = "x";
  const BenchmarkMetrics m = calculate_metrics({failed, failed}, 1.0, {99});
  EXPECT_EQ(m.completed, 0);
  EXPECT_EQ(m.failed, 2);
  EXPECT_EQ(m.summaries.at("ttft").mean_ms, 0);
  EXPECT_EQ(m.max_output_tokens_per_s, 0);
  EXPECT_THROW(calculate_metrics({failed}, 0.0, {99}), Error);
  EXPECT_THROW(metric_values({}, "latency"), Error);
}

// The prefix-cache hit from usage counts successful requests only; per-turn TTFT groups by turn.
TEST(Metrics, CachedTokensAndTtftPerTurn) {
  std::vector<RequestOutput> outs = {ok(0.0, 0.5, {}, 0.5, 1, 100), ok(0.5, 0.25, {}, 0.5, 1, 200),
                                     ok(0.0, 0.75, {}, 0.5, 1, 100),
                                     ok(0.5, 0.125, {}, 0.5, 1, 300)};
  EXPECT_FALSE(calculate_metrics(outs, 1.0, {50}).cached_reported);  // no usage detail
  EXPECT_TRUE(calculate_metrics(outs, 1.0, {50}).ttft_per_turn.empty());
  outs[0].cached_tokens = 0;
  outs[1].cached_tokens = 96;
  outs[2].cached_tokens = 0;
  outs[3].cached_tokens = 192;
  outs[1].turn = outs[3].turn = 1;
  RequestOutput failed;
  failed.cached_tokens = 50;
  failed.prompt_len = 500;
  outs.push_back(failed);
  const BenchmarkMetrics m = calculate_metrics(outs, 1.0, {50});
  EXPECT_TRUE(m.cached_reported);
  EXPECT_EQ(m.total_cached, 288);
  EXPECT_DOUBLE_EQ(prefix_cache_hit_rate(m), 288.0 / 700.0);
  ASSERT_EQ(m.ttft_per_turn.size(), 2u);
  EXPECT_DOUBLE_EQ(m.ttft_per_turn[0].mean_ms, 625);
  EXPECT_DOUBLE_EQ(m.ttft_per_turn[1].mean_ms, 187.5);
}

}  // namespace
}  // namespace attnres::bench
