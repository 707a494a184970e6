#include "clients/cpp/client.h"

#include <grpcpp/grpcpp.h>

#include <utility>

#include "attnres/v1/generate.grpc.pb.h"
#include "clients/cpp/proto_conversions.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace attnres::client {
namespace {

std::shared_ptr<grpc::Channel> make_channel(const std::string& target) {
  grpc::ChannelArguments args;
  // A non-streamed result with logprobs for thousands of tokens can pass gRPC's 4 MiB default.
  args.SetMaxReceiveMessageSize(-1);
  args.SetString(GRPC_ARG_PRIMARY_USER_AGENT_STRING, "attnres-client");
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

void check(const grpc::Status& status) {
  if (!status.ok()) throw ClientError(status);
}

// A context per call (gRPC requires it): deadline, wait-for-ready and the API key.
std::unique_ptr<grpc::ClientContext> make_context(const ClientOptions& options,
                                                  bool with_key = true) {
  auto context = std::make_unique<grpc::ClientContext>();
  if (options.timeout.count() > 0) {
    context->set_deadline(std::chrono::system_clock::now() + options.timeout);
  }
  context->set_wait_for_ready(options.wait_for_ready);
  if (with_key && !options.api_key.empty()) {
    context->AddMetadata("authorization", "Bearer " + options.api_key);
  }
  return context;
}

}  // namespace

struct Client::Stubs {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Generate::Stub> generate;
  std::unique_ptr<::grpc::health::v1::Health::Stub> health;

  explicit Stubs(std::shared_ptr<grpc::Channel> ch)
      : channel(std::move(ch)),
        generate(v1::Generate::NewStub(channel)),
        health(::grpc::health::v1::Health::NewStub(channel)) {}
};

// ---------------------------------------------------------------------------------------------
// GenerateStream

struct GenerateStream::Impl {
  std::unique_ptr<grpc::ClientContext> context;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader;
  ResultAssembler assembler;
  bool ended = false;     // Read() returned false
  bool finished = false;  // Finish() was called

  Impl(std::unique_ptr<grpc::ClientContext> ctx, int n) : context(std::move(ctx)), assembler(n) {}

  grpc::Status finish_call() {
    v1::GenerateResponse ignored;
    while (!ended && reader->Read(&ignored)) {
    }
    ended = true;
    finished = true;
    return reader->Finish();
  }
};

GenerateStream::GenerateStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
GenerateStream::GenerateStream(GenerateStream&&) noexcept = default;
GenerateStream& GenerateStream::operator=(GenerateStream&&) noexcept = default;

GenerateStream::~GenerateStream() {
  if (!impl_ || impl_->finished) return;
  // The server sees the cancellation and aborts the request (generate.proto).
  impl_->context->TryCancel();
  impl_->finish_call();
}

std::optional<StreamChunk> GenerateStream::next() {
  v1::GenerateResponse response;
  while (!impl_->ended) {
    if (!impl_->reader->Read(&response)) {
      impl_->ended = true;
      break;
    }
    if (auto chunk = impl_->assembler.add(response)) return chunk;
  }
  return std::nullopt;
}

GenerateResult GenerateStream::finish() {
  if (impl_->finished) {
    throw ClientError(grpc::StatusCode::FAILED_PRECONDITION, "GenerateStream finished twice");
  }
  // Read (and assemble) whatever next() has not taken yet.
  while (next()) {
  }
  impl_->finished = true;
  check(impl_->reader->Finish());
  return impl_->assembler.result();
}

void GenerateStream::cancel() { impl_->context->TryCancel(); }

// ---------------------------------------------------------------------------------------------
// Client

Client::Client(ClientOptions options) : Client(make_channel(options.target), options) {}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : options_(std::move(options)), stubs_(std::make_unique<Stubs>(std::move(channel))) {}

Client::~Client() = default;

GenerateStream Client::generate_stream(const GenerateOptions& options) {
  auto impl = std::make_unique<GenerateStream::Impl>(make_context(options_), options.sampling.n);
  const v1::GenerateRequest request = to_proto(options);
  impl->reader = stubs_->generate->Generate(impl->context.get(), request);
  return GenerateStream(std::move(impl));
}

GenerateResult Client::generate(const GenerateOptions& options,
                                const std::function<void(const StreamChunk&)>& on_chunk) {
  GenerateStream stream = generate_stream(options);
  while (auto chunk = stream.next()) {
    if (on_chunk) on_chunk(*chunk);  // a throwing callback cancels the call (~GenerateStream)
  }
  return stream.finish();
}

void Client::abort(const std::string& request_id) {
  v1::AbortRequest request;
  request.set_request_id(request_id);
  v1::AbortResponse response;
  check(stubs_->generate->Abort(make_context(options_).get(), request, &response));
}

TokenizeResult Client::tokenize(const std::string& text, std::optional<bool> add_special_tokens) {
  v1::TokenizeRequest request;
  request.set_text(text);
  if (add_special_tokens) request.set_add_special_tokens(*add_special_tokens);
  v1::TokenizeResponse response;
  check(stubs_->generate->Tokenize(make_context(options_).get(), request, &response));
  return {{response.token_ids().begin(), response.token_ids().end()}, response.max_model_len()};
}

std::string Client::detokenize(const std::vector<int32_t>& token_ids, bool skip_special_tokens) {
  v1::DetokenizeRequest request;
  request.mutable_token_ids()->Add(token_ids.begin(), token_ids.end());
  request.set_skip_special_tokens(skip_special_tokens);
  v1::DetokenizeResponse response;
  check(stubs_->generate->Detokenize(make_context(options_).get(), request, &response));
  return response.text();
}

ModelInfo Client::model_info() {
  v1::GetModelInfoResponse response;
  check(stubs_->generate->GetModelInfo(make_context(options_).get(), v1::GetModelInfoRequest(),
                                       &response));
  return from_proto(response);
}

const char* health_status_name(HealthStatus status) {
  switch (status) {
    case HealthStatus::kUnknown:
      return "UNKNOWN";
    case HealthStatus::kServing:
      return "SERVING";
    case HealthStatus::kNotServing:
      return "NOT_SERVING";
    case HealthStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return "UNKNOWN";
}

HealthStatus Client::health(const std::string& service) {
  ::grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  ::grpc::health::v1::HealthCheckResponse response;
  check(
      stubs_->health->Check(make_context(options_, /*with_key=*/false).get(), request, &response));
  switch (response.status()) {
    case ::grpc::health::v1::HealthCheckResponse::SERVING:
      return HealthStatus::kServing;
    case ::grpc::health::v1::HealthCheckResponse::NOT_SERVING:
      return HealthStatus::kNotServing;
    case ::grpc::health::v1::HealthCheckResponse::SERVICE_UNKNOWN:
      return HealthStatus::kServiceUnknown;
    default:
      return HealthStatus::kUnknown;
  }
}

}  // namespace attnres::client
