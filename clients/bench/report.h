// The two outputs of `attnres bench serve`, in vLLM's formats (vllm/benchmarks/serve.py):
//   - the table benchmark() prints ("============ Serving Benchmark Result ============",
//     rows formatted as Python's "{:<40} {:<10}" / "{:<40} {:<10.2f}", one section per selected
//     metric with Mean, Median and the chosen percentiles in ms);
//   - the result JSON of main_async(): the run's settings (date, backend, label, model_id,
//     tokenizer_id, num_prompts, request_rate ("inf" for a burst), burstiness,
//     max_concurrency), the totals and throughputs, latencies and queue_times per request,
//     mean_/median_/std_/pNN_<metric>_ms, and with --save-detailed the other per-request
//     arrays (input_lens, output_lens, ttfts, itls, start_times, generated_texts).
//     Ours on top: the per-request `errors` are always kept (vLLM keeps them only with
//     --save-detailed), and the data-set settings (random_input_len, ...) are recorded.
// Ours after vLLM's table (left intact so that tools parsing it keep working): a "Prefix
// Cache" section with the cached prompt tokens and the hit rate from the responses' usage
// (when the server reports cached tokens), and for multi-turn runs the TTFT of each turn; the
// JSON carries them as total_cached_tokens, prefix_cache_hit_rate and ttft_per_turn_ms.
#pragma once

#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "clients/bench/metrics.h"
#include "clients/bench/runner.h"

namespace attnres::bench {

struct ReportSettings {
  std::string backend;  // openai | openai-chat | grpc
  std::string label;    // default: the backend
  std::string base_url;
  std::string model_id;
  int num_prompts = 0;
  int input_len = 0;
  int output_len = 0;
  int prefix_len = 0;  // --random-prefix-len
  int turns = 1;       // --multi-turn
  double request_rate = 1.0 / 0.0;
  double burstiness = 1.0;
  std::optional<int> max_concurrency;
  uint64_t seed = 0;
  int num_warmups = 0;
  bool ignore_eos = true;
  std::vector<std::string> percentile_metrics;  // in the order given
  std::vector<double> metric_percentiles;
  bool save_detailed = false;
  std::string date;  // "%Y%m%d-%H%M%S", vLLM's
};

// Python's str() of a float for the cases this report needs: "inf", "4.0", "99.9".
std::string python_float_str(double value);

// vLLM's section header: `text` centred in 50 `fill` characters.
std::string centered(const std::string& text, char fill);

void print_result_table(std::ostream& out, const BenchmarkMetrics& metrics, double duration_s,
                        const ReportSettings& settings);

nlohmann::ordered_json result_json(const BenchmarkMetrics& metrics, const RunResult& run,
                                   const ReportSettings& settings);

// vLLM's compute_result_filename:
// "{label}-{request_rate}qps[-concurrency{N}]-{model basename}-{date}.json".
std::string default_result_filename(const ReportSettings& settings);

}  // namespace attnres::bench
