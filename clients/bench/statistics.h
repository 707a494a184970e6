// Summary statistics with NumPy's definitions, because vLLM's calculate_metrics
// (vllm/benchmarks/serve.py) reports np.mean, np.median, np.std and np.percentile, and our
// figures must mean the same thing:
//   - percentile: the "linear" method (NumPy's default): index (n - 1) * p / 100 between the
//     sorted values, interpolated with NumPy's _lerp (which computes from the upper neighbour
//     when the fraction is >= 0.5, so results match NumPy to the last bit or two);
//   - median: the mean of the two middle values for an even count (np.median);
//   - std: the population standard deviation (ddof = 0);
//   - an empty list reads as 0 for every statistic (vLLM passes `values or 0`).
#pragma once

#include <vector>

namespace attnres::bench {

double mean(const std::vector<double>& values);
double median(std::vector<double> values);
double stddev(const std::vector<double>& values);
// p in [0, 100].
double percentile(std::vector<double> values, double p);

}  // namespace attnres::bench
