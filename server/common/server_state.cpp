#include "server/common/server_state.h"

#include <chrono>
#include <cstdio>
#include <random>

namespace attnres::server {

ServerState::ServerState(const LoadedModel& model, EngineCore& engine, Metrics& metrics,
                         ServeOptions options)
    : model_(model),
      engine_(engine),
      metrics_(metrics),
      options_(std::move(options)),
      created_unix_(std::chrono::duration_cast<std::chrono::seconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count()),
      request_counter_(std::random_device{}()),
      response_store_(options_.max_stored_responses) {}

std::string ServerState::next_request_id(std::string_view prefix) {
  // Unique within the process (a counter), unguessable-looking across restarts (random start,
  // mixed so consecutive ids do not look consecutive).
  uint64_t n = request_counter_.fetch_add(1);
  uint64_t a = n * 0x9e3779b97f4a7c15ull;
  uint64_t b = (a ^ (a >> 29)) * 0xbf58476d1ce4e5b9ull;
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b ^ (b >> 32)));
  std::string id(prefix);
  id += '-';
  id += hex;
  return id;
}

bool ServerState::check_api_key(std::string_view key) const {
  if (options_.api_keys.empty()) return true;
  bool match = false;
  for (const std::string& expected : options_.api_keys) {
    // Constant time in the key's content: always walk the expected key's full length.
    unsigned char diff = expected.size() == key.size() ? 0 : 1;
    for (size_t i = 0; i < expected.size(); ++i) {
      const unsigned char got = i < key.size() ? static_cast<unsigned char>(key[i]) : 0;
      diff |= static_cast<unsigned char>(expected[i]) ^ got;
    }
    match |= diff == 0;
  }
  return match;
}

SamplingParams ServerState::default_sampling() const {
  const GenerationDefaults& g = model_.config.generation;
  SamplingParams p;
  if (g.temperature) p.temperature = *g.temperature;
  if (g.top_p) p.top_p = *g.top_p;
  if (g.top_k) p.top_k = *g.top_k;
  if (g.min_p) p.min_p = *g.min_p;
  if (g.repetition_penalty) p.repetition_penalty = *g.repetition_penalty;
  return p;
}

}  // namespace attnres::server
