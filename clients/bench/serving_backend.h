// What `attnres bench serve` needs from a server, whatever the protocol: the model it serves,
// its tokenizer (to build prompts of exact lengths), and one streamed request at a time.
// Implementations: HttpBackend (OpenAI /v1/completions or /v1/chat/completions over SSE) and
// GrpcBackend (attnres.v1.Generate); the unit tests use a fake with a scripted timeline.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "clients/bench/bench_types.h"
#include "clients/bench/prompt_dataset.h"

namespace attnres::bench {

// Seconds on the steady clock: every timestamp of a run is taken with it.
inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Sampling fields sent with every request when set (vLLM's --temperature, --top-p ...);
// unset ones are left to the server's defaults, as vLLM does.
struct SamplingOverrides {
  std::optional<double> temperature, top_p, min_p, frequency_penalty, presence_penalty,
      repetition_penalty;
  std::optional<int> top_k;
};

// Settings common to every request of a run.
struct RequestSettings {
  std::string model;  // the served model name sent with each request
  bool ignore_eos = true;
  double timeout_s = 600;  // a request still running after this long fails ("timeout")
  std::string request_id_prefix = "bench-";
  SamplingOverrides sampling;
};

class ServingBackend {
 public:
  virtual ~ServingBackend() = default;
  // The served model's name (vLLM: the first entry of /v1/models). Throws attnres::Error with
  // a clear message when the server cannot be reached.
  virtual std::string first_model() = 0;
  // Throws attnres::Error when `model` is not what the server serves.
  virtual void check_model(const std::string& model) = 0;
  // The server's tokenizer as this backend's prompts are counted (chat: with the template).
  virtual std::unique_ptr<PromptTokenizer> tokenizer(const RequestSettings& settings) = 0;
  // Sends one request and reads its stream to the end. Request-level failures (connection,
  // HTTP status, in-band error, timeout) come back as a failed output, never as an exception.
  // Sets start_time to the steady_seconds() at which it sent the request, and every other
  // time relative to that. Called from many threads at once.
  virtual RequestOutput send(const BenchPrompt& prompt, const RequestSettings& settings,
                             const std::string& request_id) = 0;
};

}  // namespace attnres::bench
