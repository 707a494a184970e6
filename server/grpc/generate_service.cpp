#include "server/grpc/generate_service.h"

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/error.h"
#include "server/common/auth.h"
#include "server/common/generation.h"
#include "server/common/request_error.h"
#include "server/common/token_ids.h"
#include "server/grpc/grpc_requests.h"
#include "server/grpc/grpc_responses.h"

namespace attnres::server {
namespace {

using grpc::Status;
using grpc::StatusCode;

// How long a Generate handler waits for output before checking whether its call was cancelled:
// short against an engine step, so a disconnect frees the request's KV memory promptly.
constexpr std::chrono::milliseconds kCancelPollInterval{50};

// The HTTP status each gRPC rejection corresponds to: the metrics count rejections by HTTP
// status, so both front ends report into the same series.
int http_status_for(StatusCode code) {
  switch (code) {
    case StatusCode::INVALID_ARGUMENT:
      return 400;
    case StatusCode::UNAUTHENTICATED:
      return 401;
    case StatusCode::RESOURCE_EXHAUSTED:
    case StatusCode::UNAVAILABLE:
      return 503;
    default:
      return 500;
  }
}

std::optional<std::string_view> authorization_of(const grpc::ServerContext& context) {
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) return std::nullopt;
  return std::string_view(it->second.data(), it->second.size());
}

// A refusal of the shared front-end pipeline as a gRPC status code.
StatusCode status_code_for(Refusal refusal) {
  switch (refusal) {
    case Refusal::InvalidArgument:
      return StatusCode::INVALID_ARGUMENT;
    case Refusal::Unauthenticated:
      return StatusCode::UNAUTHENTICATED;
    case Refusal::QueueFull:
      return StatusCode::RESOURCE_EXHAUSTED;
    case Refusal::Unavailable:
      return StatusCode::UNAVAILABLE;
    case Refusal::EngineFailed:
      return StatusCode::INTERNAL;
  }
  return StatusCode::INTERNAL;
}

}  // namespace

Status GenerateService::authenticate(const grpc::ServerContext& context) const {
  if (server::authenticate(state_, authorization_of(context)) == AuthResult::Ok) return Status::OK;
  return reject(StatusCode::UNAUTHENTICATED,
                "missing or invalid API key: send the metadata 'authorization: Bearer <key>'");
}

Status GenerateService::reject(StatusCode code, const std::string& message) const {
  state_.metrics().record_rejected(http_status_for(code));
  return Status(code, message);
}

Status GenerateService::Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                                 grpc::ServerWriter<v1::GenerateResponse>* writer) {
  if (Status auth = authenticate(*context); !auth.ok()) return auth;

  const LoadedModel& model = state_.model();
  GrpcGenerateRequest parsed;
  try {
    // Prompt ids must have text: padding rows past the tokenizer are refused (the engine
    // refuses them too; this names the gRPC field).
    parsed = to_engine_request(*request, state_.default_sampling(), *model.tokenizer,
                               model.vocabulary());
  } catch (const Error& e) {
    return reject(StatusCode::INVALID_ARGUMENT, e.what());
  }
  if (parsed.engine.request_id.empty()) parsed.engine.request_id = state_.next_request_id("grpc");
  const std::string request_id = parsed.engine.request_id;
  const int n = parsed.engine.n;
  const int prompt_tokens = static_cast<int>(parsed.engine.prompt_ids.size());
  const DepthAttentionLayout* depth_layout =
      parsed.engine.params.depth_attention ? &state_.engine().depth_attention_layout() : nullptr;

  std::unique_ptr<Generation> generation;
  try {
    generation = std::make_unique<Generation>(
        state_, request_id, std::vector<std::vector<int32_t>>{parsed.engine.prompt_ids},
        parsed.engine.params, n);
  } catch (const RequestError& e) {
    return reject(status_code_for(e.refusal()), e.what());
  }

  std::vector<ChoiceResult> choices(static_cast<size_t>(n));
  bool client_gone = false;  // cancelled, past its deadline, or a write failed
  bool cancel_sent = false;
  auto send = [&](v1::GenerateResponse& response) {
    response.set_request_id(request_id);
    if (!client_gone && !writer->Write(response)) client_gone = true;
  };
  RequestOutput out;
  while (!generation->ended()) {
    if (!client_gone && context->IsCancelled()) client_gone = true;
    if (client_gone && !cancel_sent) {
      generation->cancel();  // the engine ends the choices within a step; the loop drains them
      cancel_sent = true;
    }
    if (!generation->next(out)) {
      // The sync API has no cancellation callback: the wait is bounded so a cancelled call is
      // noticed within kCancelPollInterval.
      if (!generation->ended()) generation->wait_for(kCancelPollInterval);
      continue;
    }
    ChoiceResult& choice = choices[static_cast<size_t>(out.choice_index)];
    choice.add(out);
    if (client_gone) continue;  // drain to the end for the usage numbers, sending nothing
    const bool has_delta = !out.token_ids.empty() || (parsed.detokenize && !out.text.empty());
    if (parsed.stream && has_delta) {
      v1::GenerateResponse response;
      *response.mutable_chunk() = make_chunk(out, parsed.detokenize);
      send(response);
    }
    if (out.finished()) {
      v1::GenerateResponse response;
      *response.mutable_complete() =
          make_complete(out, choice, prompt_tokens, parsed.detokenize, parsed.stream, depth_layout);
      send(response);
    }
  }
  generation.reset();  // records the request's metrics
  if (client_gone) return Status(StatusCode::CANCELLED, "the call was cancelled");
  return Status::OK;
}

Status GenerateService::Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                              v1::AbortResponse* /*response*/) {
  if (Status auth = authenticate(*context); !auth.ok()) return auth;
  // Unknown or finished ids are ignored, as vLLM does: the abort may race the request's end.
  if (!request->request_id().empty()) state_.engine().abort(request->request_id());
  return Status::OK;
}

Status GenerateService::Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                                 v1::TokenizeResponse* response) {
  if (Status auth = authenticate(*context); !auth.ok()) return auth;
  const bool add_special = !request->has_add_special_tokens() || request->add_special_tokens();
  std::vector<int32_t> ids;
  try {
    ids = state_.model().tokenizer->encode(request->text(), add_special);
  } catch (const Error& e) {
    return reject(StatusCode::INVALID_ARGUMENT, std::string("text: ") + e.what());
  }
  response->mutable_token_ids()->Add(ids.begin(), ids.end());
  response->set_count(static_cast<uint32_t>(ids.size()));
  response->set_max_model_len(static_cast<uint32_t>(state_.options().max_model_len));
  return Status::OK;
}

Status GenerateService::Detokenize(grpc::ServerContext* context,
                                   const v1::DetokenizeRequest* request,
                                   v1::DetokenizeResponse* response) {
  if (Status auth = authenticate(*context); !auth.ok()) return auth;
  const Tokenizer& tokenizer = *state_.model().tokenizer;
  const std::span<const int32_t> ids(request->token_ids().data(),
                                     static_cast<size_t>(request->token_ids().size()));
  try {
    check_token_ids("token_ids", ids, state_.model().vocabulary());
    response->set_text(tokenizer.decode(ids, request->skip_special_tokens()));
  } catch (const Error& e) {
    return reject(StatusCode::INVALID_ARGUMENT, e.what());
  }
  return Status::OK;
}

Status GenerateService::GetModelInfo(grpc::ServerContext* context,
                                     const v1::GetModelInfoRequest* /*request*/,
                                     v1::GetModelInfoResponse* response) {
  if (Status auth = authenticate(*context); !auth.ok()) return auth;
  *response =
      make_model_info(state_.model(), state_.options().served_model_name,
                      state_.options().max_model_len, state_.engine().depth_attention_layout());
  return Status::OK;
}

}  // namespace attnres::server
