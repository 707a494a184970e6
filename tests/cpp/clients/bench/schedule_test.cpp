// The arrival schedule against vLLM's get_request: burst, constant gaps, and gamma gaps whose
// shape we check through the coefficient of variation (a gamma of shape k has CV 1/sqrt(k):
// Poisson arrivals have CV 1), over 20,000 gaps, to within 5%.
#include <gtest/gtest.h>

#include <cmath>

#include "clients/bench/arrival_schedule.h"
#include "engine/core/error.h"

namespace attnres::bench {
namespace {

std::vector<double> gaps(const std::vector<double>& times) {
  std::vector<double> g = {times[0]};
  for (size_t i = 1; i < times.size(); ++i) g.push_back(times[i] - times[i - 1]);
  return g;
}

double coefficient_of_variation(const std::vector<double>& v) {
  double mean = 0, var = 0;
  for (double x : v) mean += x;
  mean /= v.size();
  for (double x : v) var += (x - mean) * (x - mean);
  return std::sqrt(var / v.size()) / mean;
}

TEST(ArrivalSchedule, InfiniteRateIsABurst) {
  EXPECT_EQ(arrival_times(5, INFINITY, 1.0, 0), std::vector<double>(5, 0.0));
  EXPECT_EQ(arrival_times(5, INFINITY, 0.5, 7), std::vector<double>(5, 0.0));
}

TEST(ArrivalSchedule, InfiniteBurstinessIsConstantGaps) {
  const std::vector<double> t = arrival_times(4, 2.0, INFINITY, 0);
  EXPECT_EQ(t, (std::vector<double>{0.5, 1.0, 1.5, 2.0}));
}

TEST(ArrivalSchedule, GammaShapeFollowsBurstiness) {
  const int n = 20000;
  const double rate = 8.0;
  for (double burstiness : {0.25, 1.0, 4.0}) {
    const std::vector<double> t = arrival_times(n, rate, burstiness, 42);
    // vLLM rescales so the last request goes out at exactly n / rate: the mean gap is 1 / rate.
    EXPECT_NEAR(t.back(), n / rate, 1e-9 * n / rate) << burstiness;
    for (size_t i = 1; i < t.size(); ++i) ASSERT_GE(t[i], t[i - 1]);
    EXPECT_NEAR(coefficient_of_variation(gaps(t)), 1.0 / std::sqrt(burstiness),
                0.05 / std::sqrt(burstiness))
        << "burstiness " << burstiness;
  }
}

TEST(ArrivalSchedule, SeedDeterminesTheSchedule) {
  EXPECT_EQ(arrival_times(100, 3.0, 1.0, 5), arrival_times(100, 3.0, 1.0, 5));
  EXPECT_NE(arrival_times(100, 3.0, 1.0, 5), arrival_times(100, 3.0, 1.0, 6));
}

TEST(ArrivalSchedule, RejectsBadArguments) {
  EXPECT_THROW(arrival_times(0, 1.0, 1.0, 0), Error);
  EXPECT_THROW(arrival_times(3, 0.0, 1.0, 0), Error);
  EXPECT_THROW(arrival_times(3, -1.0, 1.0, 0), Error);
  EXPECT_THROW(arrival_times(3, 1.0, 0.0, 0), Error);
  EXPECT_THROW(arrival_times(3, NAN, 1.0, 0), Error);
}

}  // namespace
}  // namespace attnres::bench
