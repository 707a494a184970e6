// Prometheus metrics in vLLM's style, prefix "attnres:" (API.md). Engine-side counters and
// gauges come from an EngineStats snapshot at scrape time; per-request latency histograms
// are recorded by the front end that served the request, once its stream has ended.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "engine/sched/engine_core.h"

namespace attnres::server {

// A cumulative histogram with fixed upper bounds (the +Inf bucket is implicit).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double value);
  // Appends the _bucket / _sum / _count lines for `name` with the given label set.
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last = +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  // One request's latencies, once its stream ended. inter_token_seconds: the gaps between
  // consecutive outputs of each choice (what the client saw as inter-token latency).
  void record_request(const RequestTimings& timings, const Usage& usage,
                      std::span<const double> inter_token_seconds);
  // HTTP / gRPC requests rejected before reaching the engine, by status code.
  void record_rejected(int http_status);
  // HTTP connections as the server accepts and closes them.
  void http_connection_opened() {
    http_connections_open_.fetch_add(1);
    http_connections_total_.fetch_add(1);
  }
  void http_connection_closed() { http_connections_open_.fetch_sub(1); }

  // The Prometheus text exposition format (version 0.0.4).
  std::string render(const EngineStats& stats) const;

 private:
  const std::string labels_;  // model_name="..."
  mutable std::mutex mutex_;
  Histogram time_to_first_token_;
  Histogram inter_token_latency_;
  Histogram e2e_latency_;
  Histogram queue_time_;
  Histogram prompt_tokens_;
  Histogram generation_tokens_;
  std::map<int, uint64_t> rejected_;
  std::atomic<int64_t> http_connections_open_{0};
  std::atomic<uint64_t> http_connections_total_{0};
};

}  // namespace attnres::server
