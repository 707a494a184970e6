#include "clients/bench/arrival_schedule.h"

#include <cmath>
#include <random>
#include <string>

#include "engine/core/error.h"

namespace attnres::bench {

void check_arrival_process(double request_rate, double burstiness) {
  if (!(request_rate > 0)) {
    throw Error("--request-rate must be > 0 (inf sends every request at once), got " +
                std::to_string(request_rate));
  }
  if (!(burstiness > 0)) {
    throw Error("--burstiness must be > 0, got " + std::to_string(burstiness));
  }
}

std::vector<double> arrival_times(int num_requests, double request_rate, double burstiness,
                                  uint64_t seed) {
  if (num_requests < 1) throw Error("--num-prompts must be >= 1");
  check_arrival_process(request_rate, burstiness);
  std::vector<double> times(num_requests, 0.0);
  if (std::isinf(request_rate)) return times;
  if (std::isinf(burstiness)) {
    for (int i = 0; i < num_requests; ++i) times[i] = (i + 1) / request_rate;
    return times;
  }
  std::mt19937_64 rng(seed);
  std::gamma_distribution<double> gap(burstiness, 1.0 / (request_rate * burstiness));
  double t = 0;
  for (int i = 0; i < num_requests; ++i) {
    t += gap(rng);
    times[i] = t;
  }
  if (t > 0) {
    const double scale = (num_requests / request_rate) / t;
    for (double& x : times) x *= scale;
  }
  return times;
}

}  // namespace attnres::bench
