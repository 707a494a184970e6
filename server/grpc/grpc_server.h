// The gRPC server's lifecycle: binds host:grpc_port, serves attnres.v1.Generate and the
// standard grpc.health.v1.Health service (our own, server/grpc/health_service.h), and keeps the
// health status honest (NOT_SERVING once shutdown began or the engine died). `attnres serve`
// owns it (server/cli/cmd_serve.cpp).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "server/common/server_state.h"

namespace grpc {
class Server;
}

namespace attnres::server {

class GenerateService;
class HealthService;

class GrpcServer {
 public:
  explicit GrpcServer(ServerState& state);
  ~GrpcServer();  // stop() if still running
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // Binds options().host:grpc_port (0 = any free port) and starts serving. Throws
  // attnres::Error naming the address when it cannot bind.
  void start();
  int port() const { return port_; }  // the bound port, after start()
  // Health -> NOT_SERVING: shutdown began (calls keep running until stop()).
  void set_not_serving();
  // Shuts the server down (after the engine drained): health Watch calls end at once, other
  // calls still open get a short grace, then are cancelled. Idempotent.
  void stop();

 private:
  // Watches the engine: health turns NOT_SERVING when it died or stopped accepting.
  void monitor_health();
  void set_serving(bool serving);

  ServerState& state_;
  std::unique_ptr<GenerateService> service_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;

  std::mutex mutex_;  // guards stopping_ and the health status
  std::condition_variable wake_;
  bool stopping_ = false;
  bool serving_ = false;
  std::thread monitor_;
};

}  // namespace attnres::server
