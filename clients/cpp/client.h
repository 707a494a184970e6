// attnres::client::Client: a C++ client for the AttnRes Serve gRPC API
// (proto/attnres/v1/generate.proto and grpc.health.v1.Health, proto/grpc/health/v1/health.proto,
// on the same port).
//
//   attnres::client::Client client({.target = "127.0.0.1:50051", .api_key = "..."});
//   attnres::client::GenerateOptions options;
//   options.prompt = "The capital of France is";
//   options.sampling.max_tokens = 32;
//   options.sampling.temperature = 0;
//   auto result = client.generate(options, [](const attnres::client::StreamChunk& chunk) {
//     std::cout << chunk.text << std::flush;  // as the tokens arrive
//   });
//   // result.choices[0].text / .token_ids / .finish_reason, result.usage
//
// Every failed call throws ClientError with the gRPC code and the server's message. For
// control over a running generation (cancel it from another thread, read chunks in a loop)
// use generate_stream(); destroying an unfinished GenerateStream cancels the call, and the
// server then aborts the request and frees its KV cache (generate.proto). A Client is safe to
// use from several threads at once (one channel, one call per method invocation).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "clients/cpp/client_error.h"
#include "clients/cpp/types.h"

namespace grpc {
class Channel;
}

namespace attnres::client {

struct ClientOptions {
  std::string target = "127.0.0.1:50051";  // HOST:PORT, or any gRPC target URI
  // Sent as `authorization: Bearer <api_key>` on every call when not empty.
  std::string api_key;
  // Deadline of each call, generate streams included (their whole length); 0: none.
  std::chrono::milliseconds timeout{0};
  // false (gRPC's default): a call fails at once with UNAVAILABLE when the server cannot be
  // reached. true: it waits for the server (up to the timeout), e.g. right after starting it.
  bool wait_for_ready = false;
};

// One running Generate call. Move-only; not thread-safe except cancel().
class GenerateStream {
 public:
  struct Impl;
  explicit GenerateStream(std::unique_ptr<Impl> impl);
  GenerateStream(GenerateStream&&) noexcept;
  GenerateStream& operator=(GenerateStream&&) noexcept;
  // Cancels the call when it has not finished.
  ~GenerateStream();

  // Blocks for the next streamed chunk (of any choice); std::nullopt once the server has
  // sent everything (or the call failed or was cancelled): then call finish().
  std::optional<StreamChunk> next();
  // Waits for the end of the call (reading what next() has not) and returns the result, or
  // throws ClientError: the server's error status, DEADLINE_EXCEEDED, CANCELLED after
  // cancel(). Call it once.
  GenerateResult finish();
  // Cancels the call; safe from any thread, also while another thread waits in next().
  void cancel();

 private:
  std::unique_ptr<Impl> impl_;
};

class Client {
 public:
  explicit Client(ClientOptions options = {});
  // Over a channel the caller made (TLS credentials, custom channel arguments).
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Generates and blocks until every choice has finished; on_chunk (when given) sees each
  // streamed chunk as it arrives (with options.stream false there are none).
  GenerateResult generate(const GenerateOptions& options,
                          const std::function<void(const StreamChunk&)>& on_chunk = {});
  // Starts a Generate call and returns it to be read chunk by chunk.
  GenerateStream generate_stream(const GenerateOptions& options);

  // Ends the request's unfinished choices with finish_reason "abort". Unknown or finished
  // ids are not an error.
  void abort(const std::string& request_id);

  TokenizeResult tokenize(const std::string& text,
                          std::optional<bool> add_special_tokens = std::nullopt);
  std::string detokenize(const std::vector<int32_t>& token_ids, bool skip_special_tokens = false);
  ModelInfo model_info();

  // grpc.health.v1.Health/Check for `service` ("" is the whole server, "attnres.v1.Generate"
  // the generate service). Unreachable server: ClientError UNAVAILABLE; unknown service:
  // NOT_FOUND. Health needs no API key.
  HealthStatus health(const std::string& service = "");

  const ClientOptions& options() const { return options_; }

 private:
  struct Stubs;
  ClientOptions options_;
  std::unique_ptr<Stubs> stubs_;
};

}  // namespace attnres::client
