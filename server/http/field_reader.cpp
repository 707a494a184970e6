#include "server/http/field_reader.h"

#include <cmath>
#include <sstream>

#include "server/http/api_error.h"

namespace attnres::server::http {
namespace {

std::string base_field(const std::string& where) {
  const size_t cut = where.find_first_of(".[");
  return where.substr(0, cut);
}

[[noreturn]] void wrong_type(const std::string& where, const nlohmann::ordered_json& got,
                             const char* expected) {
  std::string message = "field ";
  message += where;
  message += ": expected ";
  message += expected;
  message += ", got ";
  message += json_type_name(got);
  throw bad_request(message, base_field(where));
}

template <typename T>
[[noreturn]] void out_of_range(const std::string& where, T got, T lo, T hi) {
  std::ostringstream message;
  message << "field " << where << ": got " << got << ", expected a value in [" << lo << ", " << hi
          << "]";
  throw bad_request(message.str(), base_field(where));
}

}  // namespace

std::string json_type_name(const nlohmann::ordered_json& value) {
  if (value.is_string()) {
    std::string text = "the string ";
    text += dump_json(value).substr(0, 40);
    return text;
  }
  if (value.is_boolean()) return value.get<bool>() ? "true" : "false";
  if (value.is_number()) return std::string("the number ") + dump_json(value);
  return value.type_name();  // "object", "array", "null"
}

int64_t json_integer(const nlohmann::ordered_json& value, const std::string& where, int64_t lo,
                     int64_t hi) {
  int64_t result = 0;
  if (value.is_number_integer()) {
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      out_of_range<uint64_t>(where, value.get<uint64_t>(), static_cast<uint64_t>(lo),
                             static_cast<uint64_t>(hi));
    }
    result = value.get<int64_t>();
  } else if (value.is_number_float()) {
    const double d = value.get<double>();
    if (!(std::floor(d) == d) || std::fabs(d) > 9.0e18) wrong_type(where, value, "an integer");
    result = static_cast<int64_t>(d);
  } else {
    wrong_type(where, value, "an integer");
  }
  if (result < lo || result > hi) out_of_range<int64_t>(where, result, lo, hi);
  return result;
}

FieldReader::FieldReader(const nlohmann::ordered_json& body) : body_(body) {
  if (!body.is_object()) {
    std::string message = "the request body must be a JSON object, got ";
    message += body.type_name();
    throw bad_request(message);
  }
}

const nlohmann::ordered_json* FieldReader::find(const char* name) const {
  auto it = body_.find(name);
  if (it == body_.end() || it->is_null()) return nullptr;
  return &*it;
}

std::optional<double> FieldReader::number(const char* name, double lo, double hi) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(name, *v, "a number");
  const double d = v->get<double>();
  if (!(lo <= d && d <= hi)) out_of_range<double>(name, d, lo, hi);
  return d;
}

std::optional<int64_t> FieldReader::integer(const char* name, int64_t lo, int64_t hi) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  return json_integer(*v, name, lo, hi);
}

std::optional<bool> FieldReader::boolean(const char* name) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(name, *v, "true or false");
  return v->get<bool>();
}

std::optional<std::string> FieldReader::string(const char* name) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  if (!v->is_string()) wrong_type(name, *v, "a string");
  return v->get<std::string>();
}

std::optional<std::vector<std::string>> FieldReader::string_or_list(const char* name) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  if (v->is_string()) return std::vector<std::string>{v->get<std::string>()};
  if (!v->is_array()) wrong_type(name, *v, "a string or a list of strings");
  std::vector<std::string> out;
  for (size_t i = 0; i < v->size(); ++i) {
    const auto& item = (*v)[i];
    if (!item.is_string()) {
      wrong_type(std::string(name) + "[" + std::to_string(i) + "]", item, "a string");
    }
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::optional<std::vector<int32_t>> FieldReader::int_list(const char* name) const {
  const auto* v = find(name);
  if (!v) return std::nullopt;
  if (!v->is_array()) wrong_type(name, *v, "a list of integers");
  std::vector<int32_t> out;
  for (size_t i = 0; i < v->size(); ++i) {
    std::string where = name;
    where += '[';
    where += std::to_string(i);
    where += ']';
    out.push_back(static_cast<int32_t>(json_integer((*v)[i], where, INT32_MIN, INT32_MAX)));
  }
  return out;
}

}  // namespace attnres::server::http
