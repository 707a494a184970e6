// Typed reads of the fields of one JSON object, shared by every reader of JSON the server
// takes in: config.json / generation_config.json, tokenizer.json / tokenizer_config.json and
// the OpenAI request bodies. A field that is absent or null reads as "not given"; a present
// field of the wrong type or out of range throws JsonFieldError, worded one way everywhere:
//
//   [<origin>: ]field <name>: expected an integer, got the number 4.5
//   [<origin>: ]field <name>: got 0, expected a value in [1, 2147483647]
//
// The origin (a file path) is left out for request bodies. The "field NAME: " shape is the
// one server::field_named_in() parses, so any front end can name the field at fault.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/error.h"

namespace attnres {

class JsonFieldError : public Error {
 public:
  // `where`: the value at fault as named in the message ("messages[2].role").
  JsonFieldError(const std::string& message, const std::string& where);

  // The top-level field at fault: "logit_bias" for "logit_bias[5]", "messages" for
  // "messages[2].role".
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

// An interval of numbers; each bound may be open. The default admits every finite number.
struct NumberRange {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;
  bool hi_open = false;

  static NumberRange positive() { return {0, std::numeric_limits<double>::infinity(), true}; }
  static NumberRange non_negative() { return {0, std::numeric_limits<double>::infinity()}; }
  bool contains(double x) const;
  std::string describe() const;  // "[0, 2]", "(0, 1]", "> 0", ">= 0"
};

struct JsonFieldOptions {
  // Put before every message, typically the file the object came from ("" for none).
  std::string origin;
  // Accept a float with an integral value (10.0) where an integer is expected, as pydantic
  // does for OpenAI request bodies; configs from files take integers only.
  bool integral_floats = false;

  // Options naming `origin` in messages, the rest left at their defaults.
  static JsonFieldOptions with_origin(std::string origin) {
    JsonFieldOptions options;
    options.origin = std::move(origin);
    return options;
  }
};

template <class Json>
class JsonFields {
 public:
  // `object` must outlive the reader. It need not be an object: find() then finds nothing.
  explicit JsonFields(const Json& object, JsonFieldOptions options = {});

  const Json& object() const { return object_; }
  const JsonFieldOptions& options() const { return options_; }

  // The value, or nullptr when the field is absent or null.
  const Json* find(const std::string& name) const;
  bool has(const std::string& name) const { return find(name) != nullptr; }

  // Throws JsonFieldError "[<origin>: ]field <name>: <detail>".
  [[noreturn]] void fail(const std::string& name, const std::string& detail) const;

  std::optional<int64_t> integer(const std::string& name, int64_t lo, int64_t hi) const;
  // A finite number in `range`.
  std::optional<double> number(const std::string& name, NumberRange range = {}) const;
  std::optional<bool> boolean(const std::string& name) const;
  std::optional<std::string> string(const std::string& name) const;
  // A string or a list of strings.
  std::optional<std::vector<std::string>> string_or_list(const std::string& name) const;
  // A list of 32-bit integers.
  std::optional<std::vector<int32_t>> int_list(const std::string& name) const;
  // A token id: an integer in [0, 2^31).
  std::optional<int32_t> token_id(const std::string& name) const;
  // A token id or a list of token ids (eos_token_id; Llama 3 lists several); empty if absent.
  std::vector<int32_t> token_ids(const std::string& name) const;

 private:
  const Json& object_;
  JsonFieldOptions options_;
};

// Readers of one value that is not a field of an object of its own (an item of a list, a
// nested value): `where` names it in messages ("prompt[3]"); `options` as above.
template <class Json>
int64_t json_integer(const Json& value, const std::string& where, int64_t lo, int64_t hi,
                     const JsonFieldOptions& options = {});

// Throws JsonFieldError "[<origin>: ]field <where>: expected <expected>, got <value>".
template <class Json>
[[noreturn]] void json_wrong_type(const Json& value, const std::string& where,
                                  const std::string& expected,
                                  const JsonFieldOptions& options = {});

// How a message shows a value it refuses: "the string \"ten\"" (cut at 40 characters),
// "the number 4.5", "true", "object", "array", "null".
template <class Json>
std::string json_value_text(const Json& value);

extern template class JsonFields<nlohmann::json>;
extern template class JsonFields<nlohmann::ordered_json>;

}  // namespace attnres
