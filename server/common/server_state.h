// What the HTTP and gRPC front ends share: the loaded model, the engine's inbox, the
// metrics, and the serve options. Front-end threads only read it (plus the atomics); all
// engine state stays on the engine thread (docs/ENGINE_CONTRACT.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/loaded_model.h"
#include "engine/sample/sampling_params.h"
#include "engine/sched/engine_core.h"
#include "server/common/metrics.h"
#include "server/common/response_store.h"
#include "server/common/reasoning_parser.h"
#include "server/common/tool_call_parser.h"

namespace attnres::server {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int http_port = 8000;
  int grpc_port = 50051;
  std::vector<std::string> api_keys;  // empty: no authentication
  std::string served_model_name;      // the "model" clients name and /v1/models lists
  int max_model_len = 0;              // prompt + max_tokens limit, in tokens
  int grace_period_seconds = 30;      // SIGTERM: time running requests get to finish
  bool ui = true;                     // the web playground at / (--no-ui: off)
  std::string device;                 // where the model runs, for the playground's model card
  // /v1/responses kept for previous_response_id (--max-stored-responses).
  size_t max_stored_responses = 1024;
  // How chat answers are split (--tool-call-parser / --reasoning-parser, or what the chat
  // template shows): None leaves the text as content.
  ToolCallFormat tool_call_format = ToolCallFormat::None;
  ReasoningFormat reasoning_format = ReasoningFormat::None;
};

class ServerState {
 public:
  ServerState(const LoadedModel& model, EngineCore& engine, Metrics& metrics, ServeOptions options);

  const LoadedModel& model() const { return model_; }
  EngineCore& engine() const { return engine_; }
  Metrics& metrics() const { return metrics_; }
  const ServeOptions& options() const { return options_; }
  int64_t created_unix() const { return created_unix_; }

  // False once shutdown began: new requests get 503 (gRPC UNAVAILABLE).
  bool accepting() const { return accepting_.load(); }
  void stop_accepting() { accepting_.store(false); }

  // "<prefix>-<32 hex>": unique per process (a counter mixed with a random start).
  std::string next_request_id(std::string_view prefix);
  // True when no keys are configured or `key` equals one of them; compares in constant time.
  bool check_api_key(std::string_view key) const;

  // Sampling defaults before a request's own fields: the model's generation_config.json
  // (temperature, top_p, top_k, min_p, repetition_penalty), as vLLM applies them.
  SamplingParams default_sampling() const;

  // /v1/responses' store (thread-safe), options().max_stored_responses entries at most.
  ResponseStore& response_store() const { return response_store_; }

 private:
  const LoadedModel& model_;
  EngineCore& engine_;
  Metrics& metrics_;
  const ServeOptions options_;
  const int64_t created_unix_;
  std::atomic<bool> accepting_{true};
  std::atomic<uint64_t> request_counter_;
  mutable ResponseStore response_store_;
};

}  // namespace attnres::server
