#include "server/grpc/health_service.h"

#include <chrono>

namespace attnres::server {
namespace {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

// How long a Watch call waits for a change before it looks whether its client cancelled.
constexpr std::chrono::milliseconds kWatchCancelPoll{100};

}  // namespace

HealthService::HealthService(const std::vector<std::string>& services) {
  for (const std::string& service : services) statuses_[service] = HealthCheckResponse::NOT_SERVING;
}

void HealthService::set_serving(bool serving) {
  {
    std::lock_guard lock(mutex_);
    if (shut_down_) return;
    for (auto& [service, status] : statuses_) {
      status = serving ? HealthCheckResponse::SERVING : HealthCheckResponse::NOT_SERVING;
    }
  }
  changed_.notify_all();
}

void HealthService::shutdown() {
  {
    std::lock_guard lock(mutex_);
    for (auto& [service, status] : statuses_) status = HealthCheckResponse::NOT_SERVING;
    shut_down_ = true;
  }
  changed_.notify_all();
}

HealthService::ServingStatus HealthService::status_of(const std::string& service) const {
  const auto it = statuses_.find(service);
  return it == statuses_.end() ? HealthCheckResponse::SERVICE_UNKNOWN : it->second;
}

grpc::Status HealthService::Check(grpc::ServerContext*, const HealthCheckRequest* request,
                                  HealthCheckResponse* response) {
  std::lock_guard lock(mutex_);
  const ServingStatus status = status_of(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    std::string known;
    for (const auto& [service, _] : statuses_)
      known += (known.empty() ? "\"" : ", \"") + service + "\"";
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service \"" + request->service() +
                                                         "\"; health answers for " + known);
  }
  response->set_status(status);
  return grpc::Status::OK;
}

grpc::Status HealthService::Watch(grpc::ServerContext* context, const HealthCheckRequest* request,
                                  grpc::ServerWriter<HealthCheckResponse>* writer) {
  std::unique_lock lock(mutex_);
  bool sent_any = false;
  ServingStatus last_sent = HealthCheckResponse::UNKNOWN;
  while (true) {
    const ServingStatus status = status_of(request->service());
    if (!sent_any || status != last_sent) {
      // Write without the lock: it can wait on flow control for a slow client.
      lock.unlock();
      HealthCheckResponse response;
      response.set_status(status);
      if (!writer->Write(response)) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the health watch was cancelled");
      }
      sent_any = true;
      last_sent = status;
      lock.lock();
      continue;  // the status may have changed again meanwhile
    }
    if (shut_down_) return grpc::Status::OK;  // after sending the final NOT_SERVING
    if (context->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the health watch was cancelled");
    }
    changed_.wait_for(lock, kWatchCancelPoll);
  }
}

}  // namespace attnres::server
