#include "server/grpc/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "server/grpc/generate_service.h"
#include "server/grpc/health_service.h"

namespace attnres::server {
namespace {

// How often the health monitor looks at the engine: /health-like freshness without load.
constexpr std::chrono::milliseconds kHealthPollInterval{200};
// What stop() gives calls still open before cancelling them (the engine already drained, so
// they are only flushing their last messages).
constexpr std::chrono::seconds kShutdownGrace{2};

// The service names health answers for: "" (the whole server) and the generate service.
const std::vector<std::string> kHealthServices = {"", "attnres.v1.Generate"};

std::string listen_address(const std::string& host, int port) {
  // IPv6 literals need brackets in a gRPC address.
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  std::string address = ipv6 ? "[" + host + "]" : host;
  address += ':';
  address += std::to_string(port);
  return address;
}

}  // namespace

GrpcServer::GrpcServer(ServerState& state)
    : state_(state),
      service_(std::make_unique<GenerateService>(state)),
      health_(std::make_unique<HealthService>(kHealthServices)) {}

GrpcServer::~GrpcServer() { stop(); }

void GrpcServer::start() {
  const std::string address = listen_address(state_.options().host, state_.options().grpc_port);
  // Server reflection (grpc.reflection.v1alpha / v1), so grpcurl and other tools list and call
  // the services without the .proto files. Must precede the builder, which picks up plugins.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound_port);
  builder.RegisterService(service_.get());
  builder.RegisterService(health_.get());
  server_ = builder.BuildAndStart();
  if (!server_ || bound_port == 0) {
    server_.reset();
    throw Error("gRPC: cannot listen on " + address + " (address in use or not available?)");
  }
  port_ = bound_port;
  set_serving(true);
  monitor_ = std::thread([this] { monitor_health(); });
}

void GrpcServer::set_serving(bool serving) {
  std::lock_guard lock(mutex_);
  if (!server_ || serving_ == serving) return;
  serving_ = serving;
  health_->set_serving(serving);
}

void GrpcServer::set_not_serving() { set_serving(false); }

void GrpcServer::monitor_health() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    lock.unlock();
    // Never back to SERVING: both conditions are final (shutdown; a dead engine).
    if (!state_.accepting() || !state_.engine().stats().alive) set_serving(false);
    lock.lock();
    wake_.wait_for(lock, kHealthPollInterval, [this] { return stopping_; });
  }
}

void GrpcServer::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_ || !server_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  set_serving(false);
  health_->shutdown();  // Watch calls send NOT_SERVING and end now, not at the deadline
  // Handlers poll IsCancelled(), so calls cut at the deadline end promptly.
  server_->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  server_->Wait();
}

}  // namespace attnres::server
