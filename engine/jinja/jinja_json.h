// Conversion between JSON (the render context) and Jinja values, and Python's json.dumps
// as transformers' `tojson` filter calls it (ensure_ascii=False, key order kept).
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "engine/jinja/jinja_value.h"

namespace attnres::jinja {

Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

struct DumpOptions {
  std::optional<std::string> indent;  // None, or the per-level indent string
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};

// Python json.dumps(value, ...). Throws Error for values JSON cannot hold (Undefined, ...).
std::string dumps(const Value& v, const DumpOptions& options);

}  // namespace attnres::jinja
