#include "clients/bench/statistics.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"

namespace attnres::bench {

double mean(const std::vector<double>& values) {
  if (values.empty()) return 0;
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  if (n % 2 == 1) return values[n / 2];
  return (values[n / 2 - 1] + values[n / 2]) / 2;
}

double stddev(const std::vector<double>& values) {
  if (values.empty()) return 0;
  const double m = mean(values);
  double sum = 0;
  for (double v : values) sum += (v - m) * (v - m);
  return std::sqrt(sum / static_cast<double>(values.size()));
}

double percentile(std::vector<double> values, double p) {
  if (!(p >= 0 && p <= 100)) throw Error("percentile " + std::to_string(p) + " is not in [0, 100]");
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double index = static_cast<double>(values.size() - 1) * (p / 100);
  const size_t below = static_cast<size_t>(std::floor(index));
  const size_t above = std::min(below + 1, values.size() - 1);
  const double t = index - static_cast<double>(below);
  const double a = values[below], b = values[above];
  // NumPy's _lerp: from the nearer end, so t = 1 gives b exactly.
  const double diff = b - a;
  return t >= 0.5 ? b - diff * (1 - t) : a + diff * t;
}

}  // namespace attnres::bench
