// The plain C++ values of the client library (attnres::client): what a caller fills in to
// generate (GenerateOptions, SamplingOptions) and what comes back (StreamChunk, Choice,
// GenerateResult, ModelInfo ...). They mirror proto/attnres/v1/generate.proto field for field,
// so the proto's comments are their documentation, but carry no protobuf types: code that uses
// the client needs no generated headers. Optional fields stay std::optional so that "unset"
// still means "the server's default" (the model's generation_config.json), as in the proto.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace attnres::client {

// SamplingParams of generate.proto; unset optionals take the server's defaults.
struct SamplingOptions {
  std::optional<float> temperature;  // 0 = greedy
  std::optional<float> top_p;
  std::optional<int32_t> top_k;
  std::optional<float> min_p;
  std::optional<float> repetition_penalty;
  float presence_penalty = 0;
  float frequency_penalty = 0;
  std::optional<uint64_t> seed;       // choice i uses seed + i
  std::optional<int32_t> max_tokens;  // server default 16
  int32_t min_tokens = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  std::optional<int32_t> logprobs;  // k alternatives per token; unset: no logprobs
  std::optional<bool> skip_special_tokens;
  int32_t n = 1;
  std::map<int32_t, float> logit_bias;
};

// The prompt: text (tokenized by the server) or token ids (used as given).
using Prompt = std::variant<std::string, std::vector<int32_t>>;

struct GenerateOptions {
  Prompt prompt;
  SamplingOptions sampling;
  // Client-chosen id (the key for Client::abort); empty: the server makes one.
  std::string request_id;
  std::optional<bool> add_special_tokens;  // text prompts only; server default true
  // true: chunks as tokens are generated; false: only the final result (no chunks).
  bool stream = true;
  // false: token ids only, no text anywhere (for callers that detokenize themselves).
  bool detokenize = true;
};

struct Usage {
  uint32_t prompt_tokens = 0;
  uint32_t completion_tokens = 0;
  uint32_t total_tokens = 0;
  uint32_t cached_tokens = 0;  // prompt tokens the server's prefix cache had
};

struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0;
  int32_t rank = 0;                            // 1-based
  std::vector<std::pair<int32_t, float>> top;  // (token id, logprob), best first
};

// One streamed delta of one choice: what it generated since its previous chunk.
struct StreamChunk {
  std::string request_id;
  uint32_t index = 0;  // the choice
  std::vector<int32_t> token_ids;
  std::string text;  // may be empty while a possible stop string is held back
  std::vector<TokenLogprob> logprobs;
};

// One choice, finished.
struct Choice {
  uint32_t index = 0;
  std::string text;
  std::vector<int32_t> token_ids;
  std::string finish_reason;  // "stop", "length" or "abort"
  // What ended it with "stop", when not EOS (vLLM's stop_reason); at most one is set.
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token_id;
  Usage usage;
  std::vector<TokenLogprob> logprobs;  // when SamplingOptions::logprobs was set
  std::string error;                   // non-empty: the engine ended it after an error
};

struct GenerateResult {
  std::string request_id;
  std::vector<Choice> choices;  // ordered by index
  // The whole request, as the OpenAI API counts it: the prompt once, every choice's tokens.
  Usage usage;
};

struct TokenizeResult {
  std::vector<int32_t> token_ids;
  uint32_t max_model_len = 0;
};

struct ModelInfo {
  std::string served_model_name;
  std::string model_source;
  uint32_t max_model_len = 0;
  uint32_t vocab_size = 0;
  std::string architecture;
  std::string model_type;
  std::string attnres_mode;  // "none", "block" or "full"
  uint32_t attnres_num_blocks = 0;
  uint32_t num_layers = 0;
  std::vector<int32_t> eos_token_ids;
  std::optional<int32_t> bos_token_id;
};

// grpc.health.v1.HealthCheckResponse.ServingStatus.
enum class HealthStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

const char* health_status_name(HealthStatus status);

}  // namespace attnres::client
