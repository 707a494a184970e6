#include "server/http/field_reader.h"

#include "server/http/api_error.h"

namespace attnres::server::http {

const JsonFieldOptions& request_field_options() {
  static const JsonFieldOptions options = [] {
    JsonFieldOptions o;
    o.integral_floats = true;
    return o;
  }();
  return options;
}

FieldReader::FieldReader(const nlohmann::ordered_json& body)
    : JsonFields(body, request_field_options()) {
  if (!body.is_object()) {
    std::string message = "the request body must be a JSON object, got ";
    message += body.type_name();
    throw bad_request(message);
  }
}

}  // namespace attnres::server::http
