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
// counted) and cut with /detokenize.
#pragma once

#include <memory>
#include <string>

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

std::unique_ptr<ServingBackend> make_http_backend(const std::string& base_url, OpenAiApi api,
                                                  const std::string& endpoint_override,
                                                  const std::string& api_key);

}  // namespace attnres::bench
