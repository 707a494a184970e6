// The OpenAI-compatible HTTP backends of `attnres bench serve` (cpp-httplib client):
//   openai       POST /v1/completions with a text prompt
//   openai-chat  POST /v1/chat/completions with one user message
// Both send exactly the payload of vLLM's request functions
// (vllm/benchmarks/lib/endpoint_request_func.py: async_request_openai_completions /
// async_request_openai_chat_completions): stream true, stream_options.include_usage,
// max_tokens (chat: max_completion_tokens), ignore_eos, completions also
// repetition_penalty 1.0 and logprobs null, plus the sampling overrides; headers
// Content-Type, Authorization: Bearer (when a key is set) and x-request-id. The body is read as
// it arrives, parsed as SSE (SseParser) and timed by OpenAiStreamRecorder.
// Prompts are counted with the server's /tokenize (chat: with `messages`, so the template is
// counted) and cut with /detokenize; llama.cpp's llama-server spells those routes differently,
// so the bodies carry both spellings (see tokenize_request).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "clients/bench/serving_backend.h"
#include "clients/bench/stream_recorder.h"

namespace attnres::bench {

struct HttpTarget {
  std::string host;
  int port = 80;
  std::string path_prefix;  // e.g. "/proxy" for http://host:port/proxy; usually empty
};

// "http://host:port[/prefix]" (a trailing "/" or "/v1" is dropped). Throws attnres::Error for
// anything else (https needs a TLS build of the client, which this one is not).
HttpTarget parse_http_url(const std::string& url);

// The /tokenize and /detokenize bodies of both server families. vLLM's (and attnres's) take
// "prompt" + "add_special_tokens" and answer "count" and "tokens", detokenize answers "prompt";
// llama.cpp's llama-server takes "content" + "add_special", answers "tokens" only, detokenize
// answers "content". A request names the text both ways (each server ignores the other's
// fields) and a reply is read in either form, so `bench serve` measures llama-server too.
// The readers throw attnres::Error when the reply has neither form.
nlohmann::ordered_json tokenize_request(const std::string& model, const std::string& text,
                                        bool add_special);
int tokenize_reply_count(const nlohmann::ordered_json& reply);
std::vector<int32_t> tokenize_reply_tokens(const nlohmann::ordered_json& reply);
std::string detokenize_reply_text(const nlohmann::ordered_json& reply);

std::unique_ptr<ServingBackend> make_http_backend(const std::string& base_url, OpenAiApi api,
                                                  const std::string& endpoint_override,
                                                  const std::string& api_key);

}  // namespace attnres::bench
