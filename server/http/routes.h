// The route handlers router.cpp registers. Each may throw ApiError (sent as its status),
// RequestError (mapped by router.cpp) or attnres::Error (a 400); anything else is a 500.
#pragma once

#include <nlohmann/json.hpp>

#include "server/common/server_state.h"
#include "server/http/http_message.h"

namespace attnres::server::http {

// The request body as JSON; malformed JSON or invalid UTF-8 is a 400.
nlohmann::ordered_json parse_json_body(const HttpRequest& req);
void send_json(HttpResponse& res, int status, const nlohmann::ordered_json& body);

// routes_generate.cpp
void handle_completions(ServerState& state, const HttpRequest& req, HttpResponse& res);
void handle_chat_completions(ServerState& state, const HttpRequest& req, HttpResponse& res);

// routes_responses.cpp
void handle_responses(ServerState& state, const HttpRequest& req, HttpResponse& res);
// GET /v1/responses/{id}: a stored response (404 when not stored or evicted).
void handle_response_get(ServerState& state, const HttpRequest& req, HttpResponse& res);

// routes_info.cpp
void handle_models(ServerState& state, const HttpRequest& req, HttpResponse& res);
// GET /v1/models/{model} (the id percent-decoded; 404 model_not_found for another model).
void handle_model(ServerState& state, const HttpRequest& req, HttpResponse& res);
// GET /version: {"version": the project version} (vLLM's route).
void handle_version(ServerState& state, const HttpRequest& req, HttpResponse& res);
void handle_health(ServerState& state, const HttpRequest& req, HttpResponse& res);
void handle_metrics(ServerState& state, const HttpRequest& req, HttpResponse& res);
void handle_tokenize(ServerState& state, const HttpRequest& req, HttpResponse& res);
void handle_detokenize(ServerState& state, const HttpRequest& req, HttpResponse& res);

// routes_ui.cpp
void handle_ui_file(ServerState& state, const HttpRequest& req, HttpResponse& res);
void handle_ui_model_info(ServerState& state, const HttpRequest& req, HttpResponse& res);

}  // namespace attnres::server::http
