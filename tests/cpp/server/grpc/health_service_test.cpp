// grpc.health.v1.Health (server/grpc/health_service.cpp) over a loopback port: Check's
// statuses and NOT_FOUND, Watch's first message and changes, a cancelled Watch, and shutdown()
// ending open Watch calls so that the server's Shutdown() does not wait for them.
#include "server/grpc/health_service.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>

namespace attnres::server {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

class HealthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A real loopback port: the in-process transport drops a call's last messages when the
    // server shuts down before the client read them, which TCP does not.
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&health_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    stub_ = Health::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    health_.shutdown();
    server_->Shutdown();
  }

  grpc::Status check(const std::string& service, HealthCheckResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    HealthCheckRequest request;
    request.set_service(service);
    return stub_->Check(&context, request, response);
  }

  HealthService health_{{"", "attnres.v1.Generate"}};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Health::Stub> stub_;
};

struct Watch {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;

  Watch(Health::Stub& stub, const std::string& service) {
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    HealthCheckRequest request;
    request.set_service(service);
    reader = stub.Watch(&context, request);
  }
  // The next status, or -1 when the stream ended.
  int next() {
    HealthCheckResponse response;
    return reader->Read(&response) ? response.status() : -1;
  }
};

TEST_F(HealthServiceTest, CheckAnswersKnownServicesAndNotFoundOtherwise) {
  HealthCheckResponse response;
  ASSERT_TRUE(check("", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);  // until set_serving(true)
  health_.set_serving(true);
  for (const char* service : {"", "attnres.v1.Generate"}) {
    ASSERT_TRUE(check(service, &response).ok()) << service;
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING) << service;
  }
  const grpc::Status unknown = check("no.such.Service", &response);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(unknown.error_message().find("no.such.Service"), std::string::npos);
  health_.set_serving(false);
  ASSERT_TRUE(check("attnres.v1.Generate", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
}

TEST_F(HealthServiceTest, WatchSendsTheStatusThenEachChangeAndEndsOnShutdown) {
  health_.set_serving(true);
  Watch watch(*stub_, "attnres.v1.Generate");
  EXPECT_EQ(watch.next(), HealthCheckResponse::SERVING);
  health_.set_serving(false);
  EXPECT_EQ(watch.next(), HealthCheckResponse::NOT_SERVING);
  health_.set_serving(true);
  EXPECT_EQ(watch.next(), HealthCheckResponse::SERVING);
  health_.shutdown();
  EXPECT_EQ(watch.next(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(watch.next(), -1);
  EXPECT_TRUE(watch.reader->Finish().ok());
  // Final: set_serving after shutdown changes nothing.
  health_.set_serving(true);
  HealthCheckResponse response;
  ASSERT_TRUE(check("", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
}

TEST_F(HealthServiceTest, WatchOfAnUnknownServiceStaysOpenUntilCancelled) {
  Watch watch(*stub_, "no.such.Service");
  EXPECT_EQ(watch.next(), HealthCheckResponse::SERVICE_UNKNOWN);
  health_.set_serving(true);  // no change for this service: nothing is sent
  watch.context.TryCancel();
  EXPECT_EQ(watch.next(), -1);
  EXPECT_EQ(watch.reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

TEST_F(HealthServiceTest, OpenWatchesDoNotHoldUpTheServersShutdown) {
  health_.set_serving(true);
  Watch first(*stub_, ""), second(*stub_, "attnres.v1.Generate");
  EXPECT_EQ(first.next(), HealthCheckResponse::SERVING);
  EXPECT_EQ(second.next(), HealthCheckResponse::SERVING);
  const auto started = std::chrono::steady_clock::now();
  health_.shutdown();
  server_->Shutdown();  // no deadline: it returns only once every call has ended
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  for (Watch* watch : {&first, &second}) {
    EXPECT_EQ(watch->next(), HealthCheckResponse::NOT_SERVING);
    EXPECT_EQ(watch->next(), -1);
    const grpc::Status end = watch->reader->Finish();
    EXPECT_TRUE(end.ok()) << end.error_code() << " " << end.error_message();
  }
}

}  // namespace
}  // namespace attnres::server
