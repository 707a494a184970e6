// Typed access to the fields of a JSON request body: engine/core/json_fields.h's reader with
// the request-body rules. A field that is absent or null reads as "not given" (clients send
// null for defaults); a float with an integral value (10.0) is accepted as an integer, as
// pydantic does; a present field of the wrong type or out of range throws JsonFieldError
// "field NAME: ...", which the router answers with a 400 whose param is the field. Unknown
// fields are never looked at (vLLM accepts and ignores them).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/core/json_fields.h"

namespace attnres::server::http {

// No origin (the message goes back to the client that sent the body), integral floats taken.
const JsonFieldOptions& request_field_options();

class FieldReader : public JsonFields<nlohmann::ordered_json> {
 public:
  // `body` must outlive the reader; throws a 400 when it is not a JSON object.
  explicit FieldReader(const nlohmann::ordered_json& body);

  using JsonFields::number;
  // A number in [lo, hi].
  std::optional<double> number(const std::string& name, double lo, double hi) const {
    return number(name, NumberRange{lo, hi});
  }
};

// Helpers shared with nested values: `where` names the value in messages ("messages[2].role").
inline int64_t json_integer(const nlohmann::ordered_json& value, const std::string& where,
                            int64_t lo, int64_t hi) {
  return attnres::json_integer(value, where, lo, hi, request_field_options());
}
inline std::string json_type_name(const nlohmann::ordered_json& value) {
  return json_value_text(value);
}

}  // namespace attnres::server::http
