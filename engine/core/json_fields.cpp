#include "engine/core/json_fields.h"

#include <cmath>
#include <sstream>

namespace attnres {
namespace {

std::string base_field(const std::string& where) {
  return where.substr(0, where.find_first_of(".["));
}

[[noreturn]] void throw_field_error(const JsonFieldOptions& options, const std::string& where,
                                    const std::string& detail) {
  std::string message;
  if (!options.origin.empty()) message = options.origin + ": ";
  message += "field " + where + ": " + detail;
  throw JsonFieldError(message, where);
}

template <class T>
std::string text_of(T value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

[[noreturn]] void out_of_range(const JsonFieldOptions& options, const std::string& where,
                               const std::string& got, const std::string& expected) {
  throw_field_error(options, where, "got " + got + ", expected a value " + expected);
}

std::string interval(int64_t lo, int64_t hi) {
  return "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

std::string item_name(const std::string& where, size_t i) {
  return where + "[" + std::to_string(i) + "]";
}

}  // namespace

JsonFieldError::JsonFieldError(const std::string& message, const std::string& where)
    : Error(message), field_(base_field(where)) {}

bool NumberRange::contains(double x) const {
  return (lo_open ? x > lo : x >= lo) && (hi_open ? x < hi : x <= hi);
}

std::string NumberRange::describe() const {
  if (std::isinf(hi)) return (lo_open ? "> " : ">= ") + text_of(lo);
  if (std::isinf(lo)) return (hi_open ? "< " : "<= ") + text_of(hi);
  return "in " + std::string(lo_open ? "(" : "[") + text_of(lo) + ", " + text_of(hi) +
         (hi_open ? ")" : "]");
}

template <class Json>
std::string json_value_text(const Json& value) {
  auto dump = [](const Json& v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); };
  if (value.is_string()) return "the string " + dump(value).substr(0, 40);
  if (value.is_boolean()) return value.template get<bool>() ? "true" : "false";
  if (value.is_number()) return "the number " + dump(value);
  return value.type_name();  // "object", "array", "null"
}

template <class Json>
void json_wrong_type(const Json& value, const std::string& where, const std::string& expected,
                     const JsonFieldOptions& options) {
  throw_field_error(options, where, "expected " + expected + ", got " + json_value_text(value));
}

template <class Json>
int64_t json_integer(const Json& value, const std::string& where, int64_t lo, int64_t hi,
                     const JsonFieldOptions& options) {
  int64_t result = 0;
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() &&
        value.template get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      out_of_range(options, where, std::to_string(value.template get<uint64_t>()),
                   interval(lo, hi));
    }
    result = value.template get<int64_t>();
  } else if (options.integral_floats && value.is_number_float()) {
    const double d = value.template get<double>();
    if (!(std::floor(d) == d) || std::fabs(d) > 9.0e18) {
      json_wrong_type(value, where, "an integer", options);
    }
    result = static_cast<int64_t>(d);
  } else {
    json_wrong_type(value, where, "an integer", options);
  }
  if (result < lo || result > hi)
    out_of_range(options, where, std::to_string(result), interval(lo, hi));
  return result;
}

template <class Json>
JsonFields<Json>::JsonFields(const Json& object, JsonFieldOptions options)
    : object_(object), options_(std::move(options)) {}

template <class Json>
const Json* JsonFields<Json>::find(const std::string& name) const {
  if (!object_.is_object()) return nullptr;
  auto it = object_.find(name);
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

template <class Json>
void JsonFields<Json>::fail(const std::string& name, const std::string& detail) const {
  throw_field_error(options_, name, detail);
}

template <class Json>
std::optional<int64_t> JsonFields<Json>::integer(const std::string& name, int64_t lo,
                                                 int64_t hi) const {
  const Json* v = find(name);
  if (!v) return std::nullopt;
  return json_integer(*v, name, lo, hi, options_);
}

template <class Json>
std::optional<double> JsonFields<Json>::number(const std::string& name, NumberRange range) const {
  const Json* v = find(name);
  if (!v) return std::nullopt;
  if (!v->is_number()) json_wrong_type(*v, name, "a number", options_);
  const double d = v->template get<double>();
  if (!std::isfinite(d)) json_wrong_type(*v, name, "a finite number", options_);
  if (!range.contains(d)) out_of_range(options_, name, text_of(d), range.describe());
  return d;
}

template <class Json>
std::optional<bool> JsonFields<Json>::boolean(const std::string& name) const {
  const Json* v = find(name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) json_wrong_type(*v, name, "true or false", options_);
  return v->template get<bool>();
}

template <class Json>
std::optional<std::string> JsonFields<Json>::string(const std::string& name) const {
  const Json* v = find(name);
  if (!v) return std::nullopt;
  if (!v->is_string()) json_wrong_type(*v, name, "a string", options_);
  return v->template get<std::string>();
}

template <class Json>
std::optional<std::vector<std::string>> JsonFields<Json>::string_or_list(
    const std::string& name) const {
  const Json* v = find(name);
  if (!v) return std::nullopt;
  if (v->is_string()) return std::vector<std::string>{v->template get<std::string>()};
  if (!v->is_array()) json_wrong_type(*v, name, "a string or a list of strings", options_);
  std::vector<std::string> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& item = (*v)[i];
    if (!item.is_string()) {
      json_wrong_type(item, item_name(name, i), "a string", options_);
    }
    out.push_back(item.template get<std::string>());
  }
  return out;
}

template <class Json>
std::optional<std::vector<int32_t>> JsonFields<Json>::int_list(const std::string& name) const {
  const Json* v = find(name);
  if (!v) return std::nullopt;
  if (!v->is_array()) json_wrong_type(*v, name, "a list of integers", options_);
  std::vector<int32_t> out;
  for (size_t i = 0; i < v->size(); ++i) {
    out.push_back(static_cast<int32_t>(
        json_integer((*v)[i], item_name(name, i), INT32_MIN, INT32_MAX, options_)));
  }
  return out;
}

template <class Json>
std::optional<int32_t> JsonFields<Json>::token_id(const std::string& name) const {
  auto v = integer(name, 0, std::numeric_limits<int32_t>::max());
  if (!v) return std::nullopt;
  return static_cast<int32_t>(*v);
}

template <class Json>
std::vector<int32_t> JsonFields<Json>::token_ids(const std::string& name) const {
  const Json* v = find(name);
  if (!v) return {};
  if (!v->is_array()) {
    if (!v->is_number()) {
      json_wrong_type(*v, name, "a token id or a list of token ids", options_);
    }
    return {*token_id(name)};
  }
  std::vector<int32_t> ids;
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& item = (*v)[i];
    const std::string at = item_name(name, i);
    if (!item.is_number()) json_wrong_type(item, at, "a token id", options_);
    ids.push_back(static_cast<int32_t>(
        json_integer(item, at, 0, std::numeric_limits<int32_t>::max(), options_)));
  }
  return ids;
}

template class JsonFields<nlohmann::json>;
template class JsonFields<nlohmann::ordered_json>;

template int64_t json_integer<nlohmann::json>(const nlohmann::json&, const std::string&, int64_t,
                                              int64_t, const JsonFieldOptions&);
template void json_wrong_type<nlohmann::json>(const nlohmann::json&, const std::string&,
                                              const std::string&, const JsonFieldOptions&);
template std::string json_value_text<nlohmann::json>(const nlohmann::json&);
template int64_t json_integer<nlohmann::ordered_json>(const nlohmann::ordered_json&,
                                                      const std::string&, int64_t, int64_t,
                                                      const JsonFieldOptions&);
template void json_wrong_type<nlohmann::ordered_json>(const nlohmann::ordered_json&,
                                                      const std::string&, const std::string&,
                                                      const JsonFieldOptions&);
template std::string json_value_text<nlohmann::ordered_json>(const nlohmann::ordered_json&);

}  // namespace attnres
