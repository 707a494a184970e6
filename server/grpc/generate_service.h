// The attnres.v1.Generate service over the engine loop (proto/attnres/v1/generate.proto).
// Sync API: each Generate call holds one gRPC thread while it streams; it waits on its
// RequestStream in short slices so that a cancelled or expired call aborts its request within
// an engine step (docs/ENGINE_CONTRACT.md, "What a front end does").
#pragma once

#include <grpcpp/grpcpp.h>

#include "attnres/v1/generate.grpc.pb.h"
#include "server/common/server_state.h"

namespace attnres::server {

class GenerateService final : public v1::Generate::Service {
 public:
  explicit GenerateService(ServerState& state) : state_(state) {}

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                     v1::AbortResponse* response) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context, const v1::DetokenizeRequest* request,
                          v1::DetokenizeResponse* response) override;
  grpc::Status GetModelInfo(grpc::ServerContext* context, const v1::GetModelInfoRequest* request,
                            v1::GetModelInfoResponse* response) override;

 private:
  // OK, or UNAUTHENTICATED when keys are configured and the call's
  // "authorization: Bearer <key>" metadata is missing or wrong.
  grpc::Status authenticate(const grpc::ServerContext& context) const;
  // A status for a request turned away before the engine saw it, counted in the metrics.
  grpc::Status reject(grpc::StatusCode code, const std::string& message) const;

  ServerState& state_;
};

}  // namespace attnres::server
