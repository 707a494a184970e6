// The one exception the client library throws: a failed call, carrying the gRPC status code
// and the server's message unchanged (they name the bad field: "field temperature: got -1 ..."),
// so callers can branch on code() (RESOURCE_EXHAUSTED: retry later; INVALID_ARGUMENT: fix the
// request) and show message() to people.
#pragma once

#include <grpcpp/support/status.h>

#include <stdexcept>
#include <string>

namespace attnres::client {

class ClientError : public std::runtime_error {
 public:
  ClientError(grpc::StatusCode code, const std::string& message);
  explicit ClientError(const grpc::Status& status)
      : ClientError(status.error_code(), status.error_message()) {}

  grpc::StatusCode code() const { return code_; }
  // The server's (or gRPC's) message, without the code; what() is "CODE: message".
  const std::string& message() const { return message_; }

 private:
  grpc::StatusCode code_;
  std::string message_;
};

// "INVALID_ARGUMENT", "UNAVAILABLE" ...: the names of grpc/status.h, as grpcurl and the
// Python client print them.
const char* status_code_name(grpc::StatusCode code);

}  // namespace attnres::client
