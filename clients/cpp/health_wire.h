// The two messages of grpc.health.v1.Health/Check in protobuf wire format, written by hand.
//
// Why by hand: Debian's libgrpc++ implements the health service on the server (with upb) but
// ships neither health.proto nor a generated client stub, and the two messages are tiny:
//   HealthCheckRequest  { string service = 1; }
//   HealthCheckResponse { ServingStatus status = 1; }   (UNKNOWN 0, SERVING 1, NOT_SERVING 2,
//                                                        SERVICE_UNKNOWN 3)
// Encoding them here and calling the method through grpc::GenericStub keeps the build free of
// a vendored third-party .proto. The decoder skips unknown fields, as generated code would.
#pragma once

#include <string>
#include <string_view>

#include "clients/cpp/types.h"

namespace attnres::client {

inline constexpr const char* kHealthCheckMethod = "/grpc.health.v1.Health/Check";

std::string encode_health_check_request(std::string_view service);

// Throws ClientError (INTERNAL) when the bytes are not a HealthCheckResponse.
HealthStatus decode_health_check_response(std::string_view bytes);

}  // namespace attnres::client
