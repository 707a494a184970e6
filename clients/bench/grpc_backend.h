// The gRPC backend of `attnres bench serve`: attnres.v1.Generate (proto/attnres/v1/
// generate.proto) through the client library (clients/cpp/client.h), streaming with a text
// prompt,
// max_tokens and ignore_eos (plus the sampling overrides). Each GenerateStreamChunk is a chunk
// for TTFT / ITL (vLLM's rules, as for HTTP); the output and prompt token counts come from
// GenerateComplete.usage, and GenerateComplete.error or a non-OK status fail the request.
// Prompts are counted with Tokenize (add_special_tokens true, as Generate does for text) and
// cut with Detokenize. The service has no model field: --model must equal the served name.
#pragma once

#include <memory>
#include <string>

#include "clients/bench/serving_backend.h"

namespace attnres::bench {

// target: "HOST:PORT", optionally written "grpc://HOST:PORT".
std::unique_ptr<ServingBackend> make_grpc_backend(const std::string& target,
                                                  const std::string& api_key);

}  // namespace attnres::bench
