// grpc.health.v1.Health (proto/grpc/health/v1/health.proto), our own implementation: Check
// answers a known service's status or NOT_FOUND; Watch sends the status at once and then each
// change, until the client cancels or the server shuts down. GrpcServer owns it and drives
// it from the engine's liveness and the shutdown (server/grpc/grpc_server.cpp).
//
// Sync API: a Watch call holds one gRPC thread. It waits for changes in short slices so that a
// cancelled call ends within one slice, and shutdown() ends every Watch at once (after its
// final NOT_SERVING), so open Watch streams never hold up the server's shutdown.
#pragma once

#include <grpcpp/grpcpp.h>

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"

namespace attnres::server {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  using ServingStatus = grpc::health::v1::HealthCheckResponse::ServingStatus;

  // The services health answers for ("" is the whole server), all NOT_SERVING at first.
  explicit HealthService(const std::vector<std::string>& services);

  // Every known service -> SERVING or NOT_SERVING; Watch calls see the change. Ignored after
  // shutdown().
  void set_serving(bool serving);
  // Final: every service NOT_SERVING, every Watch call sends that and ends (OK), and new
  // Watch calls end right after their first message.
  void shutdown();

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  // The status of `service`, SERVICE_UNKNOWN when it is not one of ours. Needs mutex_.
  ServingStatus status_of(const std::string& service) const;

  std::mutex mutex_;  // guards statuses_ and shut_down_
  std::condition_variable changed_;
  std::map<std::string, ServingStatus> statuses_;
  bool shut_down_ = false;
};

}  // namespace attnres::server
