// Typed access to the fields of a JSON request body. A field that is absent or null reads as
// "not given" (clients send null for defaults); a present field of the wrong type or out of
// range is a 400 naming it. Unknown fields are never looked at (vLLM accepts and ignores them).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace attnres::server::http {

class FieldReader {
 public:
  // `body` must outlive the reader; throws a 400 when it is not a JSON object.
  explicit FieldReader(const nlohmann::ordered_json& body);

  // nullptr when absent or null.
  const nlohmann::ordered_json* find(const char* name) const;
  bool has(const char* name) const { return find(name) != nullptr; }

  std::optional<double> number(const char* name, double lo, double hi) const;
  // Integers; a float with an integral value (10.0) is accepted like pydantic does.
  std::optional<int64_t> integer(const char* name, int64_t lo, int64_t hi) const;
  std::optional<bool> boolean(const char* name) const;
  std::optional<std::string> string(const char* name) const;
  // A string or a list of strings.
  std::optional<std::vector<std::string>> string_or_list(const char* name) const;
  std::optional<std::vector<int32_t>> int_list(const char* name) const;

 private:
  const nlohmann::ordered_json& body_;
};

// Helpers shared with nested objects: `where` names the value in messages ("messages[2].role").
int64_t json_integer(const nlohmann::ordered_json& value, const std::string& where, int64_t lo,
                     int64_t hi);
std::string json_type_name(const nlohmann::ordered_json& value);

}  // namespace attnres::server::http
