// The client library against an in-process fake attnres.v1.Generate server (plus gRPC's own
// health service): what reaches the server (request fields, the API key metadata), what the
// caller gets back (streamed chunks, the assembled result, errors with the server's code and
// message), and cancellation: destroying an unfinished stream, cancel() from another thread,
// a throwing callback and a deadline each end the call on the server's side too, which is
// what makes the real server abort the request. The real server is covered end to end by
// tests/python/test_clients.py.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "attnres/v1/generate.grpc.pb.h"
#include "clients/cpp/client.h"

namespace attnres::client {
namespace {

using namespace std::chrono_literals;

// Prompts the fake understands: "two chunks" streams a short answer, "error" fails with
// INVALID_ARGUMENT, "forever" streams one chunk and then waits for the client to cancel.
class FakeGenerateService final : public v1::Generate::Service {
 public:
  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override {
    record(*context, *request);
    if (request->text() == "error") {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "field temperature: got -1");
    }
    v1::GenerateResponse response;
    response.set_request_id(request->request_id().empty() ? "fake-1" : request->request_id());
    auto* chunk = response.mutable_chunk();
    chunk->add_token_ids(10);
    chunk->set_text("Hel");
    writer->Write(response);
    if (request->text() == "forever") {
      const auto give_up = std::chrono::steady_clock::now() + 30s;
      while (!context->IsCancelled() && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(2ms);
      }
      std::lock_guard lock(mutex_);
      saw_cancel_ = context->IsCancelled();
      changed_.notify_all();
      return grpc::Status::CANCELLED;
    }
    response.mutable_chunk()->clear_token_ids();
    response.mutable_chunk()->add_token_ids(11);
    response.mutable_chunk()->set_text("lo");
    writer->Write(response);
    auto* complete = response.mutable_complete();
    complete->set_finish_reason("length");
    complete->add_output_ids(10);
    complete->add_output_ids(11);
    complete->set_text("Hello");
    complete->mutable_usage()->set_prompt_tokens(3);
    complete->mutable_usage()->set_completion_tokens(2);
    complete->mutable_usage()->set_total_tokens(5);
    writer->Write(response);
    return grpc::Status::OK;
  }

  grpc::Status Abort(grpc::ServerContext* context, const v1::AbortRequest* request,
                     v1::AbortResponse*) override {
    std::lock_guard lock(mutex_);
    aborted_ = request->request_id();
    authorization_ = metadata(*context);
    return grpc::Status::OK;
  }

  grpc::Status Tokenize(grpc::ServerContext*, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override {
    // One "token" per byte, plus a BOS 0 unless add_special_tokens is false.
    if (!request->has_add_special_tokens() || request->add_special_tokens()) {
      response->add_token_ids(0);
    }
    for (unsigned char c : request->text()) response->add_token_ids(c);
    response->set_count(response->token_ids_size());
    response->set_max_model_len(77);
    return grpc::Status::OK;
  }

  grpc::Status Detokenize(grpc::ServerContext*, const v1::DetokenizeRequest* request,
                          v1::DetokenizeResponse* response) override {
    std::string text = request->skip_special_tokens() ? "" : "<s>";
    for (int32_t id : request->token_ids()) text += static_cast<char>(id);
    response->set_text(text);
    return grpc::Status::OK;
  }

  grpc::Status GetModelInfo(grpc::ServerContext* context, const v1::GetModelInfoRequest*,
                            v1::GetModelInfoResponse* response) override {
    if (metadata(*context) != "Bearer secret") {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or invalid API key");
    }
    response->set_served_model_name("fake");
    response->set_max_model_len(77);
    response->set_bos_token_id(0);
    return grpc::Status::OK;
  }

  // Waits (bounded) until a "forever" call has ended; whether the server saw it cancelled.
  bool wait_for_cancel() {
    std::unique_lock lock(mutex_);
    changed_.wait_for(lock, 30s, [this] { return saw_cancel_.has_value(); });
    return saw_cancel_.value_or(false);
  }

  v1::GenerateRequest last_request() {
    std::lock_guard lock(mutex_);
    return last_request_;
  }
  std::string authorization() {
    std::lock_guard lock(mutex_);
    return authorization_;
  }
  std::string aborted() {
    std::lock_guard lock(mutex_);
    return aborted_;
  }

 private:
  static std::string metadata(const grpc::ServerContext& context) {
    auto it = context.client_metadata().find("authorization");
    return it == context.client_metadata().end()
               ? ""
               : std::string(it->second.data(), it->second.size());
  }
  void record(const grpc::ServerContext& context, const v1::GenerateRequest& request) {
    std::lock_guard lock(mutex_);
    last_request_ = request;
    authorization_ = metadata(context);
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  v1::GenerateRequest last_request_;
  std::string authorization_;
  std::string aborted_;
  std::optional<bool> saw_cancel_;
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_TRUE(server_ && port_ > 0);
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now() + 1s); }

  ClientOptions options(const std::string& api_key = "") const {
    ClientOptions o;
    o.target = "127.0.0.1:" + std::to_string(port_);
    o.api_key = api_key;
    o.timeout = 60s;
    return o;
  }

  static GenerateOptions prompt(const std::string& text) {
    GenerateOptions o;
    o.prompt = text;
    return o;
  }

  FakeGenerateService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(ClientTest, GenerateStreamsChunksAndAssemblesTheResult) {
  Client client(options("secret"));
  GenerateOptions request = prompt("two chunks");
  request.sampling.max_tokens = 2;
  request.sampling.seed = 5;
  request.request_id = "mine";
  std::string streamed;
  std::vector<int32_t> streamed_ids;
  const GenerateResult result = client.generate(request, [&](const StreamChunk& chunk) {
    EXPECT_EQ(chunk.request_id, "mine");
    streamed += chunk.text;
    streamed_ids.insert(streamed_ids.end(), chunk.token_ids.begin(), chunk.token_ids.end());
  });
  EXPECT_EQ(streamed, "Hello");
  EXPECT_EQ(streamed_ids, (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(result.request_id, "mine");
  ASSERT_EQ(result.choices.size(), 1u);
  EXPECT_EQ(result.choices[0].text, "Hello");
  EXPECT_EQ(result.choices[0].token_ids, streamed_ids);
  EXPECT_EQ(result.choices[0].finish_reason, "length");
  EXPECT_EQ(result.usage.total_tokens, 5u);
  // What the server received.
  const v1::GenerateRequest sent = service_.last_request();
  EXPECT_EQ(sent.text(), "two chunks");
  EXPECT_EQ(sent.request_id(), "mine");
  EXPECT_EQ(sent.sampling_params().max_tokens(), 2);
  EXPECT_EQ(sent.sampling_params().seed(), 5u);
  EXPECT_EQ(service_.authorization(), "Bearer secret");
}

TEST_F(ClientTest, NoApiKeyNoAuthorizationMetadata) {
  Client client(options());
  client.generate(prompt("two chunks"));
  EXPECT_EQ(service_.authorization(), "");
  try {
    client.model_info();
    FAIL() << "the fake wants a key";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.code(), grpc::StatusCode::UNAUTHENTICATED);
  }
}

TEST_F(ClientTest, ServerErrorsKeepTheirCodeAndMessage) {
  Client client(options());
  try {
    client.generate(prompt("error"));
    FAIL() << "no error";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_EQ(e.message(), "field temperature: got -1");
    EXPECT_STREQ(e.what(), "INVALID_ARGUMENT: field temperature: got -1");
  }
}

TEST_F(ClientTest, DestroyingAnUnfinishedStreamCancelsTheCall) {
  Client client(options());
  {
    GenerateStream stream = client.generate_stream(prompt("forever"));
    auto first = stream.next();
    ASSERT_TRUE(first);
    EXPECT_EQ(first->text, "Hel");
  }  // destroyed mid-stream
  EXPECT_TRUE(service_.wait_for_cancel());
}

TEST_F(ClientTest, CancelFromAnotherThreadEndsNextAndFinish) {
  Client client(options());
  GenerateStream stream = client.generate_stream(prompt("forever"));
  ASSERT_TRUE(stream.next());
  std::thread canceller([&stream] {
    std::this_thread::sleep_for(20ms);  // let next() block first (either order must work)
    stream.cancel();
  });
  EXPECT_FALSE(stream.next());  // blocked until the cancel
  canceller.join();
  try {
    stream.finish();
    FAIL() << "a cancelled call finished";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.code(), grpc::StatusCode::CANCELLED);
  }
  EXPECT_TRUE(service_.wait_for_cancel());
}

TEST_F(ClientTest, AThrowingCallbackCancelsTheCall) {
  Client client(options());
  EXPECT_THROW(client.generate(prompt("forever"),
                               [](const StreamChunk&) { throw std::runtime_error("enough"); }),
               std::runtime_error);
  EXPECT_TRUE(service_.wait_for_cancel());
}

TEST_F(ClientTest, TheDeadlineEndsALongCall) {
  ClientOptions o = options();
  o.timeout = 300ms;
  Client client(o);
  try {
    client.generate(prompt("forever"));
    FAIL() << "no deadline";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  EXPECT_TRUE(service_.wait_for_cancel());
}

TEST_F(ClientTest, TokenizeDetokenizeModelInfoAbort) {
  Client client(options("secret"));
  EXPECT_EQ(client.tokenize("AB").token_ids, (std::vector<int32_t>{0, 65, 66}));
  EXPECT_EQ(client.tokenize("AB", false).token_ids, (std::vector<int32_t>{65, 66}));
  EXPECT_EQ(client.tokenize("").max_model_len, 77u);
  EXPECT_EQ(client.detokenize({72, 105}), "<s>Hi");
  EXPECT_EQ(client.detokenize({72, 105}, true), "Hi");
  const ModelInfo info = client.model_info();
  EXPECT_EQ(info.served_model_name, "fake");
  EXPECT_EQ(info.bos_token_id, 0);
  client.abort("req-9");
  EXPECT_EQ(service_.aborted(), "req-9");
  EXPECT_EQ(service_.authorization(), "Bearer secret");
}

TEST_F(ClientTest, HealthThroughGrpcsOwnHealthService) {
  Client client(options("secret"));
  EXPECT_EQ(client.health(), HealthStatus::kServing);
  server_->GetHealthCheckService()->SetServingStatus("attnres.v1.Generate", false);
  EXPECT_EQ(client.health("attnres.v1.Generate"), HealthStatus::kNotServing);
  server_->GetHealthCheckService()->SetServingStatus(false);
  EXPECT_EQ(client.health(), HealthStatus::kNotServing);
  try {
    client.health("no.such.Service");
    FAIL() << "an unknown service is NOT_FOUND";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.code(), grpc::StatusCode::NOT_FOUND);
  }
}

TEST_F(ClientTest, AnUnreachableServerIsUnavailable) {
  ClientOptions o = options();
  server_->Shutdown(std::chrono::system_clock::now());
  server_->Wait();
  Client client(o);
  try {
    client.health();
    FAIL() << "a stopped server answered";
  } catch (const ClientError& e) {
    EXPECT_EQ(e.code(), grpc::StatusCode::UNAVAILABLE);
  }
}

}  // namespace
}  // namespace attnres::client
