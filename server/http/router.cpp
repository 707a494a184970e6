#include "server/http/router.h"

#include <iostream>
#include <string_view>

#include "engine/core/error.h"
#include "engine/core/json_fields.h"
#include "server/common/auth.h"
#include "server/common/request_error.h"
#include "server/http/api_error.h"
#include "server/http/routes.h"

namespace attnres::server::http {
namespace {

struct RouteEntry {
  std::string_view method;
  std::string_view path;  // a trailing {name} matches any non-empty rest (the handler reads it)
  Route route;
};

constexpr RouteEntry kRoutes[] = {
    // ---- the OpenAI API ----
    {"POST", "/v1/completions", {handle_completions, true, false}},
    {"POST", "/v1/chat/completions", {handle_chat_completions, true, false}},
    {"GET", "/v1/models", {handle_models, true, true}},
    {"GET", "/v1/models/{model}", {handle_model, true, true}},
    {"POST", "/v1/responses", {handle_responses, true, false}},
    {"GET", "/v1/responses/{response_id}", {handle_response_get, true, true}},
    // ---- vLLM's extras ----
    {"POST", "/tokenize", {handle_tokenize, true, false}},
    {"POST", "/detokenize", {handle_detokenize, true, false}},
    {"GET", "/version", {handle_version, true, true}},
    // ---- operations (no API key) ----
    {"GET", "/health", {handle_health, false, true}},
    {"GET", "/metrics", {handle_metrics, false, true}},
    // ---- the web playground (server/http/ui/; the page loads without the key) ----
    {"GET", "/", {handle_ui_file, false, true}},
    {"GET", "/ui/app.js", {handle_ui_file, false, true}},
    {"GET", "/ui/app.css", {handle_ui_file, false, true}},
    {"GET", "/ui/model-info", {handle_ui_model_info, true, true}},
};

bool path_matches(std::string_view pattern, std::string_view path) {
  const size_t name = pattern.find('{');
  if (name == std::string_view::npos) return pattern == path;
  return path.size() > name && path.substr(0, name) == pattern.substr(0, name);
}

// An error the front-end pipeline raised, as an HTTP status.
ApiError to_api_error(const ServerState& state, const RequestError& e) {
  switch (e.refusal()) {
    case Refusal::InvalidArgument:
      return ApiError(400, e.what(), e.param());
    case Refusal::Unauthenticated:
      return ApiError(401, e.what(), "", "invalid_api_key");
    case Refusal::QueueFull:
      return ApiError(503, e.what(), "", "queue_full");
    case Refusal::Unavailable:
      return ApiError(503, e.what(), "", "unavailable");
    case Refusal::EngineFailed:
      return ApiError(state.engine().stats().alive ? 500 : 503, e.what());
  }
  return ApiError(500, e.what());
}

}  // namespace

void send_error(HttpResponse& res, int status, const std::string& message, const std::string& param,
                const std::string& code) {
  res = HttpResponse{};
  res.status = status;
  if (status == 503) res.headers.emplace_back("Retry-After", "1");
  res.set_content(dump_json(error_body(status, message, param, code)), "application/json");
}

const Route* Router::find(const HttpRequest& request, HttpResponse& error) const {
  bool path_known = false;
  for (const RouteEntry& entry : kRoutes) {
    if (!path_matches(entry.path, request.path)) continue;
    path_known = true;
    // HEAD is GET without the body (RFC 9110); the connection drops the body.
    if (entry.method == request.method || (request.method == "HEAD" && entry.method == "GET")) {
      return &entry.route;
    }
  }
  if (path_known) {
    send_error(error, 405, "method " + request.method + " is not allowed on " + request.path);
  } else {
    send_error(error, 404, "no route " + request.method + " " + request.path, "", "not_found");
  }
  state_.metrics().record_rejected(error.status);
  return nullptr;
}

HttpResponse Router::run(const Route& route, const HttpRequest& request) const {
  HttpResponse res;
  try {
    if (route.needs_key) {
      switch (authenticate(state_, request.header("Authorization"))) {
        case AuthResult::Ok:
          break;
        case AuthResult::Missing:
          throw ApiError(401, "Missing API key: send Authorization: Bearer <key>.", "",
                         "invalid_api_key");
        case AuthResult::Invalid:
          throw ApiError(401, "Incorrect API key provided.", "", "invalid_api_key");
      }
    }
    route.handler(state_, request, res);
    return res;
  } catch (const ApiError& e) {
    send_error(res, e.status(), e.what(), e.param(), e.code());
  } catch (const RequestError& e) {
    const ApiError api = to_api_error(state_, e);
    send_error(res, api.status(), api.what(), api.param(), api.code());
  } catch (const JsonFieldError& e) {  // a request body's field of the wrong type or range
    send_error(res, 400, e.what(), e.field());
  } catch (const Error& e) {
    send_error(res, 400, e.what(), field_named_in(e.what()));
  } catch (const std::exception& e) {
    std::cerr << "attnres serve: HTTP " << request.method << " " << request.path
              << ": internal error: " << e.what() << std::endl;
    send_error(res, 500, std::string("internal error: ") + e.what());
  } catch (...) {
    send_error(res, 500, "internal error");
  }
  state_.metrics().record_rejected(res.status);
  return res;
}

}  // namespace attnres::server::http
