#include "engine/sample/json_schema_support.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <string_view>

namespace attnres {
namespace {

using Json = nlohmann::json;

// What xgrammar 0.2.9 (cpp/json_schema_converter.cc) warns about and ignores.
constexpr std::array<std::string_view, 10> kIgnoredKeywords = {
    "not",         "if",       "then",        "else",       "dependentRequired", "dependentSchemas",
    "uniqueItems", "contains", "minContains", "maxContains"};

// Keys whose value is an object of named subschemas, or a subschema / list of subschemas.
constexpr std::array<std::string_view, 4> kNamedSchemas = {"properties", "$defs", "definitions",
                                                           "patternProperties"};
constexpr std::array<std::string_view, 8> kSubschemas = {
    "items", "additionalProperties", "anyOf",         "oneOf",
    "allOf", "prefixItems",          "propertyNames", "additionalItems"};

std::optional<std::string> find_in(const Json& schema, const std::string& path) {
  if (!schema.is_object()) return std::nullopt;
  for (std::string_view keyword : kIgnoredKeywords) {
    if (schema.contains(std::string(keyword))) {
      return "'" + std::string(keyword) + "' at " + (path.empty() ? "/" : path);
    }
  }
  const auto type = schema.find("type");
  const bool number = type != schema.end() && type->is_string() && *type == "number";
  if (number && schema.contains("multipleOf")) {
    return "'multipleOf' on a number at " + (path.empty() ? "/" : path);
  }
  if (schema.contains("pattern") &&
      (schema.contains("minLength") || schema.contains("maxLength"))) {
    return "'pattern' with 'minLength' / 'maxLength' at " + (path.empty() ? "/" : path);
  }
  for (std::string_view key : kNamedSchemas) {
    const auto it = schema.find(std::string(key));
    if (it == schema.end() || !it->is_object()) continue;
    for (const auto& [name, sub] : it->items()) {
      if (auto found = find_in(sub, path + "/" + std::string(key) + "/" + name)) return found;
    }
  }
  for (std::string_view key : kSubschemas) {
    const auto it = schema.find(std::string(key));
    if (it == schema.end()) continue;
    const std::string where = path + "/" + std::string(key);
    if (it->is_array()) {
      for (size_t i = 0; i < it->size(); ++i) {
        if (auto found = find_in((*it)[i], where + "/" + std::to_string(i))) return found;
      }
    } else if (auto found = find_in(*it, where)) {
      return found;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<std::string> unsupported_json_schema_keyword(const std::string& schema) {
  const Json parsed = Json::parse(schema, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return std::nullopt;
  return find_in(parsed, "");
}

int json_nesting_depth(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      escaped = !escaped && c == '\\';
      in_string = escaped || c != '"';
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace attnres
