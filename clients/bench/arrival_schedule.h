// When each benchmark request is sent, relative to the start: vLLM's get_request
// (vllm/benchmarks/serve.py), without its ramp-up options.
//   - request rate inf: every request at time 0 (a burst);
//   - burstiness inf: a constant gap of 1 / rate;
//   - otherwise gaps drawn from a gamma distribution with shape = burstiness and
//     scale = 1 / (rate * burstiness), i.e. mean 1 / rate (burstiness 1 is a Poisson process;
//     below 1 burstier, above 1 more regular). The cumulative times are then rescaled so the
//     last request is sent at exactly num_requests / rate, as vLLM does to make throughput
//     comparable across seeds.
// The draws come from std::mt19937_64 seeded with `seed`: the same seed gives the same
// schedule (on the same standard library), though not NumPy's numbers.
#pragma once

#include <cstdint>
#include <vector>

namespace attnres::bench {

// Throws attnres::Error naming the flag unless request_rate > 0 (inf allowed) and
// burstiness > 0: what arrival_times() accepts, for checking flags before any work starts.
void check_arrival_process(double request_rate, double burstiness);

// Seconds after the start at which request i is sent; non-decreasing.
std::vector<double> arrival_times(int num_requests, double request_rate, double burstiness,
                                  uint64_t seed);

}  // namespace attnres::bench
