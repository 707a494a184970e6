#include "server/http/api_error.h"

namespace attnres::server::http {

ApiError::ApiError(int status, const std::string& message, std::string param, std::string code)
    : std::runtime_error(message),
      status_(status),
      param_(std::move(param)),
      code_(std::move(code)) {}

ApiError bad_request(const std::string& message, const std::string& param) {
  return ApiError(400, message, param);
}

const char* error_type_for_status(int status) {
  switch (status) {
    case 401:
      return "invalid_request_error";  // OpenAI sends 401 with this type, code invalid_api_key
    case 404:
      return "invalid_request_error";
    case 503:
      return "service_unavailable";
    default:
      return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

nlohmann::ordered_json error_body(int status, const std::string& message, const std::string& param,
                                  const std::string& code) {
  nlohmann::ordered_json error;
  error["message"] = message;
  error["type"] = error_type_for_status(status);
  error["param"] = param.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(param);
  error["code"] = code.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(code);
  nlohmann::ordered_json body;
  body["error"] = std::move(error);
  return body;
}

nlohmann::ordered_json error_body(const ApiError& error) {
  return error_body(error.status(), error.what(), error.param(), error.code());
}

std::string dump_json(const nlohmann::ordered_json& value) {
  return value.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace attnres::server::http
