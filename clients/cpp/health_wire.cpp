#include "clients/cpp/health_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>

#include "clients/cpp/client_error.h"

namespace attnres::client {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr int kFieldNumber = 1;  // `service` in the request, `status` in the response

}  // namespace

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

std::string encode_health_check_request(std::string_view service) {
  std::string bytes;
  if (service.empty()) return bytes;  // proto3 leaves default values out
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.WriteTag(WireFormatLite::MakeTag(kFieldNumber, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    out.WriteVarint32(static_cast<uint32_t>(service.size()));
    out.WriteRaw(service.data(), static_cast<int>(service.size()));
  }  // the CodedOutputStream flushes into `bytes` here
  return bytes;
}

HealthStatus decode_health_check_response(std::string_view bytes) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  uint32_t status = 0;  // absent field: UNKNOWN
  while (const uint32_t tag = in.ReadTag()) {
    if (tag == WireFormatLite::MakeTag(kFieldNumber, WireFormatLite::WIRETYPE_VARINT)) {
      if (!in.ReadVarint32(&status)) break;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      throw ClientError(grpc::StatusCode::INTERNAL, "malformed grpc.health.v1 response");
    }
  }
  if (!in.ConsumedEntireMessage() || in.CurrentPosition() != static_cast<int>(bytes.size())) {
    throw ClientError(grpc::StatusCode::INTERNAL, "malformed grpc.health.v1 response");
  }
  // An enum value this client does not know (a newer server) is not SERVING.
  return status <= 3 ? static_cast<HealthStatus>(status) : HealthStatus::kUnknown;
}

}  // namespace attnres::client
