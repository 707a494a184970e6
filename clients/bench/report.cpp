#include "clients/bench/report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace attnres::bench {
namespace {

struct MetricName {
  const char* key;     // ttft
  const char* name;    // TTFT
  const char* header;  // Time to First Token
};

// vLLM's process_one_metric calls, in its order.
constexpr MetricName kMetrics[] = {
    {"ttft", "TTFT", "Time to First Token"},
    {"tpot", "TPOT", "Time per Output Token (excl. 1st token)"},
    {"itl", "ITL", "Inter-token Latency"},
    {"e2el", "E2EL", "End-to-end Latency"},
    {"client_queue_time", "Client Queue Time", "Client-side Queueing"},
    {"e2el_including_client_queue", "E2EL incl. Client Queue",
     "Queue-inclusive End-to-end Latency"},
};

// Python's "{:<40} {:<10}".format(label, value) for a preformatted value.
std::string row(const std::string& label, const std::string& value) {
  std::string line = label;
  if (line.size() < 40) line.append(40 - line.size(), ' ');
  line += ' ';
  line += value;
  if (value.size() < 10) line.append(10 - value.size(), ' ');
  return line;
}

std::string fixed2(double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", value);
  return buf;
}

// vLLM's p_word: "99" for 99.0, "99.9" for 99.9.
std::string percentile_word(double p) {
  if (p == std::floor(p)) return std::to_string(static_cast<long long>(p));
  return python_float_str(p);
}

bool selected(const ReportSettings& s, const std::string& metric) {
  return std::find(s.percentile_metrics.begin(), s.percentile_metrics.end(), metric) !=
         s.percentile_metrics.end();
}

}  // namespace

std::string python_float_str(double value) {
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if (std::isnan(value)) return "nan";
  if (value == std::floor(value) && std::fabs(value) < 1e16) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.1f", value);
    return buf;
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);  // shortest round trip, as repr
  return ec == std::errc() ? std::string(buf, end) : std::to_string(value);
}

std::string centered(const std::string& text, char fill) {
  constexpr size_t kWidth = 50;
  if (text.size() >= kWidth) return text;
  const size_t pad = kWidth - text.size();
  // Python's format "^": the odd padding character goes to the right.
  return std::string(pad / 2, fill) + text + std::string(pad - pad / 2, fill);
}

void print_result_table(std::ostream& out, const BenchmarkMetrics& m, double duration_s,
                        const ReportSettings& s) {
  out << centered(" Serving Benchmark Result ", '=') << "\n";
  out << row("Successful requests:", std::to_string(m.completed)) << "\n";
  out << row("Failed requests:", std::to_string(m.failed)) << "\n";
  if (s.max_concurrency) {
    out << row("Maximum request concurrency:", std::to_string(*s.max_concurrency)) << "\n";
  }
  if (!std::isinf(s.request_rate)) {
    out << row("Request rate configured (RPS):", fixed2(s.request_rate)) << "\n";
  }
  out << row("Benchmark duration (s):", fixed2(duration_s)) << "\n";
  out << row("Total input tokens:", std::to_string(m.total_input)) << "\n";
  out << row("Total generated tokens:", std::to_string(m.total_output)) << "\n";
  out << row("Request throughput (req/s):", fixed2(m.request_throughput)) << "\n";
  out << row("Output token throughput (tok/s):", fixed2(m.output_throughput)) << "\n";
  out << row("Peak output token throughput (tok/s):", fixed2(m.max_output_tokens_per_s)) << "\n";
  out << row("Peak concurrent requests:", fixed2(m.max_concurrent_requests)) << "\n";
  out << row("Total token throughput (tok/s):", fixed2(m.total_token_throughput)) << "\n";
  for (const MetricName& metric : kMetrics) {
    auto summary = m.summaries.find(metric.key);
    if (!selected(s, metric.key) || summary == m.summaries.end()) continue;
    const std::string name = metric.name;
    out << centered(metric.header, '-') << "\n";
    out << row("Mean " + name + " (ms):", fixed2(summary->second.mean_ms)) << "\n";
    out << row("Median " + name + " (ms):", fixed2(summary->second.median_ms)) << "\n";
    for (const auto& [p, value] : summary->second.percentiles_ms) {
      std::string label = "P";  // appended, not "P" + ...: GCC 12 warns falsely (-Wrestrict)
      label += percentile_word(p) + " " + name + " (ms):";
      out << row(label, fixed2(value)) << "\n";
    }
  }
  out << std::string(50, '=') << "\n";
  if (m.cached_reported) {
    out << centered(" Prefix Cache (from usage) ", '=') << "\n";
    out << row("Total cached prompt tokens:", std::to_string(m.total_cached)) << "\n";
    out << row("Prefix cache hit rate (%):", fixed2(100 * prefix_cache_hit_rate(m))) << "\n";
  }
  if (!m.ttft_per_turn.empty()) {
    out << centered(" TTFT per Turn ", '=') << "\n";
    for (size_t k = 0; k < m.ttft_per_turn.size(); ++k) {
      const std::string turn = "turn " + std::to_string(k + 1);
      out << row("Mean TTFT " + turn + " (ms):", fixed2(m.ttft_per_turn[k].mean_ms)) << "\n";
      out << row("Median TTFT " + turn + " (ms):", fixed2(m.ttft_per_turn[k].median_ms)) << "\n";
    }
  }
  if (m.cached_reported || !m.ttft_per_turn.empty()) out << std::string(50, '=') << "\n";
}

nlohmann::ordered_json result_json(const BenchmarkMetrics& m, const RunResult& run,
                                   const ReportSettings& s) {
  using Json = nlohmann::ordered_json;
  Json j;
  j["date"] = s.date;
  j["endpoint_type"] = s.backend;
  j["backend"] = s.backend;
  j["label"] = s.label.empty() ? Json(nullptr) : Json(s.label);
  j["model_id"] = s.model_id;
  j["tokenizer_id"] = s.model_id;  // the server's own tokenizer counted every prompt
  j["num_prompts"] = s.num_prompts;
  j["request_rate"] = std::isinf(s.request_rate) ? Json("inf") : Json(s.request_rate);
  j["burstiness"] = s.burstiness;
  j["max_concurrency"] = s.max_concurrency ? Json(*s.max_concurrency) : Json(nullptr);

  const std::vector<RequestOutput>& outs = run.outputs;
  auto per_request = [&](auto field) {
    Json a = Json::array();
    for (const RequestOutput& o : outs) a.push_back(field(o));
    return a;
  };
  j["duration"] = run.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input;
  j["total_output_tokens"] = m.total_output;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = nullptr;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  if (s.save_detailed) {
    j["input_lens"] = per_request([](const RequestOutput& o) { return o.prompt_len; });
    j["output_lens"] = m.output_lens;
    j["cached_tokens"] = per_request([](const RequestOutput& o) { return o.cached_tokens; });
    j["ttfts"] = per_request([](const RequestOutput& o) { return o.ttft; });
    j["itls"] = per_request([](const RequestOutput& o) { return o.itl; });
  }
  j["latencies"] = per_request([](const RequestOutput& o) { return o.latency; });
  if (s.save_detailed) {
    j["start_times"] = per_request([](const RequestOutput& o) { return o.start_time; });
  }
  j["queue_times"] = per_request([](const RequestOutput& o) { return o.queue_time; });
  if (s.save_detailed) {
    j["generated_texts"] = per_request([](const RequestOutput& o) { return o.generated_text; });
  }
  j["errors"] = per_request([](const RequestOutput& o) { return o.error; });
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  j["rtfx"] = 0.0;
  for (const MetricName& metric : kMetrics) {
    auto summary = m.summaries.find(metric.key);
    if (!selected(s, metric.key) || summary == m.summaries.end()) continue;
    const std::string key = metric.key;
    j["mean_" + key + "_ms"] = summary->second.mean_ms;
    j["median_" + key + "_ms"] = summary->second.median_ms;
    j["std_" + key + "_ms"] = summary->second.std_ms;
    for (const auto& [p, value] : summary->second.percentiles_ms) {
      std::string field = "p";
      field += percentile_word(p) + "_" + key + "_ms";
      j[field] = value;
    }
  }
  // Ours: the data set and run settings, so a result file says how it was made.
  j["base_url"] = s.base_url;
  j["random_input_len"] = s.input_len;
  j["random_output_len"] = s.output_len;
  j["random_prefix_len"] = s.prefix_len;
  j["multi_turn"] = s.turns;
  if (m.cached_reported) {
    j["total_cached_tokens"] = m.total_cached;
    j["prefix_cache_hit_rate"] = prefix_cache_hit_rate(m);
  }
  if (!m.ttft_per_turn.empty()) {
    Json turns = Json::array();
    for (const MetricSummary& t : m.ttft_per_turn) {
      turns.push_back({{"mean", t.mean_ms}, {"median", t.median_ms}});
    }
    j["ttft_per_turn_ms"] = turns;
  }
  j["seed"] = s.seed;
  j["num_warmups"] = s.num_warmups;
  j["ignore_eos"] = s.ignore_eos;
  j["percentile_metrics"] = s.percentile_metrics;
  j["metric_percentiles"] = s.metric_percentiles;
  return j;
}

std::string default_result_filename(const ReportSettings& s) {
  std::string model = s.model_id;
  if (size_t slash = model.rfind('/'); slash != std::string::npos) model = model.substr(slash + 1);
  std::string name =
      (s.label.empty() ? s.backend : s.label) + "-" + python_float_str(s.request_rate) + "qps";
  if (s.max_concurrency) name += "-concurrency" + std::to_string(*s.max_concurrency);
  return name + "-" + model + "-" + s.date + ".json";
}

}  // namespace attnres::bench
