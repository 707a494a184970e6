// The serving metrics of a benchmark run, computed exactly as vLLM's calculate_metrics
// (vllm/benchmarks/serve.py) computes them from the per-request outputs:
//   - only successful requests count towards tokens, throughput and latencies;
//   - TTFT, E2EL: per request; ITL: every gap between successive chunks, of every request;
//   - TPOT: (E2EL - TTFT) / (output tokens - 1), for requests with more than one output token;
//   - throughput: completed requests / duration, output tokens / duration,
//     (input + output tokens) / duration;
//   - peak output tokens/s: chunk arrival times (start + TTFT + cumulative ITL) counted in
//     one-second buckets from the first start; peak concurrency: a sweep over the half-open
//     intervals [start, start + E2EL), departures before arrivals at equal times.
// Ours on top: the prefix-cache hit of the successful requests from their usage (cached /
// prompt tokens), and for multi-turn runs the TTFT of each turn.
// Latency statistics are reported in milliseconds, like vLLM's.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "clients/bench/bench_types.h"

namespace attnres::bench {

// mean / median / std / chosen percentiles of one metric, in ms.
struct MetricSummary {
  double mean_ms = 0;
  double median_ms = 0;
  double std_ms = 0;
  std::vector<std::pair<double, double>> percentiles_ms;  // (p, value)
};

struct BenchmarkMetrics {
  int completed = 0;
  int failed = 0;
  long long total_input = 0;
  long long total_output = 0;
  double request_throughput = 0;
  double output_throughput = 0;
  double total_token_throughput = 0;
  double max_output_tokens_per_s = 0;
  int max_concurrent_requests = 0;
  // Output tokens per request (0 for failed ones): vLLM's actual_output_lens.
  std::vector<int> output_lens;
  // "ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue".
  std::map<std::string, MetricSummary> summaries;
  // usage.prompt_tokens_details.cached_tokens summed over successful requests; reported is
  // false when no response carried it (a server without prefix-cache usage).
  bool cached_reported = false;
  long long total_cached = 0;
  // Multi-turn runs: TTFT of the successful requests of turn k, at [k] (empty for one turn).
  std::vector<MetricSummary> ttft_per_turn;
};

// cached / input tokens, in [0, 1] (0 when there was no input).
double prefix_cache_hit_rate(const BenchmarkMetrics& metrics);

// The per-request values (seconds) a metric summarises, over successful requests:
// what calculate_metrics collects into ttfts / tpots / itls / e2els.
std::vector<double> metric_values(const std::vector<RequestOutput>& outputs,
                                  const std::string& metric);

// A summary of values given in seconds, reported in ms.
MetricSummary summarize_seconds(const std::vector<double>& seconds,
                                const std::vector<double>& percentiles);

// Every metric above for a run of `duration_s` seconds. The client-queue metrics are only
// summarised when `with_queue_metrics` (vLLM: with --max-concurrency; the queue-inclusive
// E2EL only when the request rate is finite as well: pass with_queue_inclusive_e2el).
BenchmarkMetrics calculate_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                   const std::vector<double>& percentiles,
                                   bool with_queue_metrics = false,
                                   bool with_queue_inclusive_e2el = false);

}  // namespace attnres::bench
