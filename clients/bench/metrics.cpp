#include "clients/bench/metrics.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "clients/bench/statistics.h"
#include "engine/core/error.h"

namespace attnres::bench {

std::vector<double> metric_values(const std::vector<RequestOutput>& outputs,
                                  const std::string& metric) {
  static const std::set<std::string> kKnown = {
      "ttft", "tpot", "itl", "e2el", "client_queue_time", "e2el_including_client_queue"};
  if (!kKnown.count(metric)) {
    throw Error("unknown metric '" + metric +
                "' (expected ttft, tpot, itl, e2el, client_queue_time or "
                "e2el_including_client_queue)");
  }
  std::vector<double> values;
  for (const RequestOutput& o : outputs) {
    if (!o.success) continue;
    if (metric == "ttft") {
      values.push_back(o.ttft);
    } else if (metric == "tpot") {
      // vLLM leaves single-token requests out of TPOT (it has no second token).
      if (o.output_tokens > 1) values.push_back((o.latency - o.ttft) / (o.output_tokens - 1));
    } else if (metric == "itl") {
      values.insert(values.end(), o.itl.begin(), o.itl.end());
    } else if (metric == "e2el") {
      values.push_back(o.latency);
    } else if (metric == "client_queue_time") {
      values.push_back(o.queue_time);
    } else {  // e2el_including_client_queue
      values.push_back(o.latency + o.queue_time);
    }
  }
  return values;
}

MetricSummary summarize_seconds(const std::vector<double>& seconds,
                                const std::vector<double>& percentiles) {
  MetricSummary s;
  s.mean_ms = mean(seconds) * 1000;
  s.median_ms = median(seconds) * 1000;
  s.std_ms = stddev(seconds) * 1000;
  for (double p : percentiles) s.percentiles_ms.emplace_back(p, percentile(seconds, p) * 1000);
  return s;
}

namespace {

// vLLM's "max_output_tokens_per_s" and "max_concurrent_requests".
void peak_metrics(const std::vector<RequestOutput>& outputs, BenchmarkMetrics& m) {
  std::vector<const RequestOutput*> ok;
  for (const RequestOutput& o : outputs) {
    if (o.success) ok.push_back(&o);
  }
  if (ok.empty()) return;
  double min_start = ok[0]->start_time, max_end = ok[0]->start_time + ok[0]->latency;
  for (const RequestOutput* o : ok) {
    min_start = std::min(min_start, o->start_time);
    max_end = std::max(max_end, o->start_time + o->latency);
  }
  const long buckets = static_cast<long>(std::ceil(max_end - min_start)) + 1;
  std::vector<double> tokens_per_second(buckets, 0);
  for (const RequestOutput* o : ok) {
    double t = o->start_time + o->ttft;
    auto count = [&](double time) {
      const long bucket = static_cast<long>(time - min_start);  // truncation, as int() in Python
      if (bucket >= 0 && bucket < buckets) tokens_per_second[bucket] += 1;
    };
    count(t);
    for (double gap : o->itl) {
      t += gap;
      count(t);
    }
  }
  m.max_output_tokens_per_s = *std::max_element(tokens_per_second.begin(), tokens_per_second.end());

  std::vector<std::pair<double, int>> events;
  for (const RequestOutput* o : ok) {
    events.emplace_back(o->start_time, +1);
    events.emplace_back(o->start_time + o->latency, -1);
  }
  std::sort(events.begin(), events.end());  // (time, delta): -1 sorts before +1 at a tie
  int current = 0;
  for (const auto& e : events) {
    current += e.second;
    m.max_concurrent_requests = std::max(m.max_concurrent_requests, current);
  }
}

void per_turn_ttft(const std::vector<RequestOutput>& outputs,
                   const std::vector<double>& percentiles, BenchmarkMetrics& m) {
  int turns = 0;
  for (const RequestOutput& o : outputs) turns = std::max(turns, o.turn + 1);
  if (turns < 2) return;
  std::vector<std::vector<double>> ttfts(turns);
  for (const RequestOutput& o : outputs) {
    if (o.success) ttfts[o.turn].push_back(o.ttft);
  }
  for (const std::vector<double>& values : ttfts) {
    m.ttft_per_turn.push_back(summarize_seconds(values, percentiles));
  }
}

}  // namespace

BenchmarkMetrics calculate_metrics(const std::vector<RequestOutput>& outputs, double duration_s,
                                   const std::vector<double>& percentiles, bool with_queue_metrics,
                                   bool with_queue_inclusive_e2el) {
  if (!(duration_s > 0)) throw Error("benchmark duration must be positive");
  BenchmarkMetrics m;
  for (const RequestOutput& o : outputs) {
    if (o.success) {
      ++m.completed;
      m.total_input += o.prompt_len;
      m.total_output += o.output_tokens;
      m.output_lens.push_back(o.output_tokens);
      if (o.cached_tokens >= 0) {
        m.cached_reported = true;
        m.total_cached += o.cached_tokens;
      }
    } else {
      ++m.failed;
      m.output_lens.push_back(0);
    }
  }
  m.request_throughput = m.completed / duration_s;
  m.output_throughput = static_cast<double>(m.total_output) / duration_s;
  m.total_token_throughput = static_cast<double>(m.total_input + m.total_output) / duration_s;
  for (const char* metric : {"ttft", "tpot", "itl", "e2el"}) {
    m.summaries[metric] = summarize_seconds(metric_values(outputs, metric), percentiles);
  }
  if (with_queue_metrics) {
    m.summaries["client_queue_time"] =
        summarize_seconds(metric_values(outputs, "client_queue_time"), percentiles);
    if (with_queue_inclusive_e2el) {
      m.summaries["e2el_including_client_queue"] =
          summarize_seconds(metric_values(outputs, "e2el_including_client_queue"), percentiles);
    }
  }
  peak_metrics(outputs, m);
  per_turn_ttft(outputs, percentiles, m);
  return m;
}

double prefix_cache_hit_rate(const BenchmarkMetrics& m) {
  return m.total_input > 0 ? static_cast<double>(m.total_cached) / m.total_input : 0.0;
}

}  // namespace attnres::bench
