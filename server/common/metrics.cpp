#include "server/common/metrics.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace attnres::server {
namespace {

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name;
  out += '{';
  out += labels;
  out += "} ";
  out += number(v);
  out += '\n';
}

double seconds_between(EngineClock::time_point a, EngineClock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// vLLM's latency buckets (seconds) and token-count buckets.
const std::vector<double> kTtftBuckets = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                          0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                          20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
const std::vector<double> kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                                         0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
const std::vector<double> kRequestBuckets = {0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                             5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
const std::vector<double> kTokenBuckets = {
    1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000, 200000};

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? number(bounds_[i]) : "+Inf";
    sample(out, name + "_bucket", labels + ",le=\"" + le + "\"", static_cast<double>(cumulative));
  }
  sample(out, name + "_sum", labels, sum_);
  sample(out, name + "_count", labels, static_cast<double>(count_));
}

Metrics::Metrics(std::string model_name)
    : labels_("model_name=\"" + model_name + "\""),
      time_to_first_token_(kTtftBuckets),
      inter_token_latency_(kItlBuckets),
      e2e_latency_(kRequestBuckets),
      queue_time_(kRequestBuckets),
      prompt_tokens_(kTokenBuckets),
      generation_tokens_(kTokenBuckets) {}

void Metrics::record_request(const RequestTimings& t, const Usage& usage,
                             std::span<const double> inter_token_seconds) {
  std::lock_guard lock(mutex_);
  if (t.first_token) time_to_first_token_.observe(seconds_between(t.arrival, *t.first_token));
  if (t.first_scheduled) queue_time_.observe(seconds_between(t.arrival, *t.first_scheduled));
  if (t.finished) e2e_latency_.observe(seconds_between(t.arrival, *t.finished));
  for (double gap : inter_token_seconds) inter_token_latency_.observe(gap);
  prompt_tokens_.observe(usage.prompt_tokens);
  generation_tokens_.observe(usage.completion_tokens);
}

void Metrics::record_rejected(int http_status) {
  std::lock_guard lock(mutex_);
  ++rejected_[http_status];
}

std::string Metrics::render(const EngineStats& s) const {
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    header(out, name, "gauge", help);
    sample(out, name, labels_, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    header(out, name, "counter", help);
    sample(out, name, labels_, v);
  };
  gauge("attnres:num_requests_running", "Sequences in the running batch.", s.num_running);
  gauge("attnres:num_requests_waiting", "Sequences waiting to be scheduled (preempted included).",
        s.num_waiting);
  gauge("attnres:kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).",
        s.kv_cache_usage);
  gauge("attnres:engine_alive", "1 while the engine can serve, 0 after it failed.",
        s.alive ? 1 : 0);
  counter("attnres:prompt_tokens_total", "Prompt tokens processed (prefill).",
          static_cast<double>(s.prompt_tokens_total));
  counter("attnres:generation_tokens_total", "Tokens generated.",
          static_cast<double>(s.generation_tokens_total));
  counter("attnres:num_preemptions_total", "Sequences preempted (recomputed later).",
          static_cast<double>(s.preemptions_total));
  counter("attnres:prefix_cache_queries_total",
          "Prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries).",
          static_cast<double>(s.prefix_cache_queries_total));
  counter("attnres:prefix_cache_hits_total",
          "Looked-up prompt tokens the prefix cache held (vLLM's prefix_cache_hits).",
          static_cast<double>(s.prefix_cache_hits_total));
  gauge("attnres:http_connections", "Open HTTP connections (idle ones included).",
        static_cast<double>(http_connections_open_.load()));
  counter("attnres:http_connections_total", "HTTP connections accepted.",
          static_cast<double>(http_connections_total_.load()));
  header(out, "attnres:request_success_total", "counter", "Finished sequences by finish reason.");
  sample(out, "attnres:request_success_total", labels_ + ",finished_reason=\"stop\"",
         static_cast<double>(s.finished_stop));
  sample(out, "attnres:request_success_total", labels_ + ",finished_reason=\"length\"",
         static_cast<double>(s.finished_length));
  sample(out, "attnres:request_success_total", labels_ + ",finished_reason=\"abort\"",
         static_cast<double>(s.finished_abort));

  std::lock_guard lock(mutex_);
  header(out, "attnres:requests_rejected_total", "counter",
         "Requests answered with an error before reaching the engine, by status code.");
  for (const auto& [status, count] : rejected_) {
    sample(out, "attnres:requests_rejected_total",
           labels_ + ",status=\"" + std::to_string(status) + "\"", static_cast<double>(count));
  }
  const std::pair<const char*, const Histogram*> histograms[] = {
      {"attnres:time_to_first_token_seconds", &time_to_first_token_},
      {"attnres:inter_token_latency_seconds", &inter_token_latency_},
      {"attnres:e2e_request_latency_seconds", &e2e_latency_},
      {"attnres:request_queue_time_seconds", &queue_time_},
      {"attnres:request_prompt_tokens", &prompt_tokens_},
      {"attnres:request_generation_tokens", &generation_tokens_},
  };
  const char* helps[] = {"Time to first token.",        "Time between consecutive outputs.",
                         "End-to-end request latency.", "Time waiting before first scheduled.",
                         "Prompt tokens per request.",  "Generated tokens per request."};
  for (size_t i = 0; i < std::size(histograms); ++i) {
    header(out, histograms[i].first, "histogram", helps[i]);
    histograms[i].second->render(out, histograms[i].first, labels_);
  }
  return out;
}

}  // namespace attnres::server
