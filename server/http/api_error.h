// The OpenAI error envelope, {"error": {"message", "type", "param", "code"}}, and the
// exception the route code throws to send one with a given HTTP status.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "server/common/request_error.h"

namespace attnres::server::http {

class ApiError : public std::runtime_error {
 public:
  // `param`: the request field at fault ("" when none); `code`: OpenAI's machine-readable
  // code ("" gives null).
  ApiError(int status, const std::string& message, std::string param = "", std::string code = "");

  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_;
  std::string code_;
};

// 400 naming the field.
ApiError bad_request(const std::string& message, const std::string& param = "");

// OpenAI's error "type" for an HTTP status (invalid_request_error, server_error, ...).
const char* error_type_for_status(int status);

nlohmann::ordered_json error_body(int status, const std::string& message,
                                  const std::string& param = "", const std::string& code = "");
nlohmann::ordered_json error_body(const ApiError& error);

// JSON text for the wire: invalid UTF-8 (a token that is part of a character) is replaced
// with U+FFFD instead of throwing.
std::string dump_json(const nlohmann::ordered_json& value);

}  // namespace attnres::server::http
