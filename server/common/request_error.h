// Why the front-end pipeline refused or failed a request, in terms both front ends map onto
// their own protocol: HTTP to a status and the OpenAI error envelope (server/http/api_error.h),
// gRPC to a status code (server/grpc/generate_service.cpp).
#pragma once

#include <string>

#include "engine/core/error.h"

namespace attnres::server {

enum class Refusal {
  InvalidArgument,  // 400 / INVALID_ARGUMENT: the message names the field
  Unauthenticated,  // 401 / UNAUTHENTICATED
  QueueFull,        // 503 + Retry-After / RESOURCE_EXHAUSTED
  Unavailable,      // 503 / UNAVAILABLE: shutting down, or the engine died
  EngineFailed,     // 500 (503 once the engine died) / INTERNAL: a choice ended in an error
};

class RequestError : public Error {
 public:
  // `param`: the request field at fault ("" when none).
  RequestError(Refusal refusal, const std::string& message, std::string param = "")
      : Error(message), refusal_(refusal), param_(std::move(param)) {}

  Refusal refusal() const { return refusal_; }
  const std::string& param() const { return param_; }

 private:
  Refusal refusal_;
  std::string param_;
};

// The field named by an engine message in the "field X: got ..." style of
// SamplingParams::validate / EngineCore::validate ("" when the message names none).
std::string field_named_in(const std::string& message);

}  // namespace attnres::server
