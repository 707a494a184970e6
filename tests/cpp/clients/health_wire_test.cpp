// The hand-written grpc.health.v1 messages (clients/cpp/health_wire.h), checked against
// protobuf's own generic wire parser and writer (UnknownFieldSet), which knows nothing of our
// encoder: the request parses as field 1 = the service name, and responses written field by
// field (with unknown fields around the status, as a newer server could send) decode right.
#include <google/protobuf/unknown_field_set.h>
#include <gtest/gtest.h>

#include "clients/cpp/client_error.h"
#include "clients/cpp/health_wire.h"

namespace attnres::client {
namespace {

using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

std::string serialize(const UnknownFieldSet& fields) {
  std::string bytes;
  EXPECT_TRUE(fields.SerializeToString(&bytes));
  return bytes;
}

TEST(HealthWire, RequestIsFieldOneHoldingTheServiceName) {
  EXPECT_EQ(encode_health_check_request(""), "");  // proto3: the default is left out
  for (const std::string& service : {std::string("attnres.v1.Generate"), std::string(300, 's')}) {
    const std::string bytes = encode_health_check_request(service);
    UnknownFieldSet fields;
    ASSERT_TRUE(fields.ParseFromString(bytes));
    ASSERT_EQ(fields.field_count(), 1);
    EXPECT_EQ(fields.field(0).number(), 1);
    ASSERT_EQ(fields.field(0).type(), UnknownField::TYPE_LENGTH_DELIMITED);
    EXPECT_EQ(fields.field(0).length_delimited(), service);
  }
}

TEST(HealthWire, DecodesEveryStatus) {
  EXPECT_EQ(decode_health_check_response(""), HealthStatus::kUnknown);  // status 0 left out
  for (int status = 0; status <= 3; ++status) {
    UnknownFieldSet fields;
    fields.AddVarint(1, static_cast<uint64_t>(status));
    EXPECT_EQ(decode_health_check_response(serialize(fields)), static_cast<HealthStatus>(status));
  }
  EXPECT_EQ(decode_health_check_response("\x08\x01"), HealthStatus::kServing);
}

TEST(HealthWire, SkipsUnknownFieldsAndValues) {
  UnknownFieldSet fields;
  fields.AddLengthDelimited(7, "a newer server's field");
  fields.AddVarint(1, 2);
  fields.AddFixed64(9, 12345);
  EXPECT_EQ(decode_health_check_response(serialize(fields)), HealthStatus::kNotServing);
  UnknownFieldSet newer_status;
  newer_status.AddVarint(1, 17);  // an enum value this client does not know: not SERVING
  EXPECT_EQ(decode_health_check_response(serialize(newer_status)), HealthStatus::kUnknown);
}

TEST(HealthWire, MalformedBytesAreAnError) {
  for (const std::string& bytes : {std::string("\x08"),
                                   std::string("\x0a\x05"
                                               "ab"),
                                   std::string("\x00\x01", 2), std::string("\x08\xff")}) {
    try {
      decode_health_check_response(bytes);
      ADD_FAILURE() << "decoded malformed bytes of size " << bytes.size();
    } catch (const ClientError& e) {
      EXPECT_EQ(e.code(), grpc::StatusCode::INTERNAL);
    }
  }
}

TEST(HealthWire, StatusNames) {
  EXPECT_STREQ(health_status_name(HealthStatus::kServing), "SERVING");
  EXPECT_STREQ(health_status_name(HealthStatus::kNotServing), "NOT_SERVING");
  EXPECT_STREQ(health_status_name(HealthStatus::kServiceUnknown), "SERVICE_UNKNOWN");
  EXPECT_STREQ(health_status_name(HealthStatus::kUnknown), "UNKNOWN");
}

}  // namespace
}  // namespace attnres::client
