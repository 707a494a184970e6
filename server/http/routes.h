// The route handlers http_server.cpp registers. Each may throw ApiError (sent as its status)
// or attnres::Error (a 400); http_server.cpp turns anything else into a 500.
#pragma once

#include <httplib.h>

#include <nlohmann/json.hpp>

#include "server/common/server_state.h"

namespace attnres::server::http {

// The request body as JSON; malformed JSON or invalid UTF-8 is a 400.
nlohmann::ordered_json parse_json_body(const httplib::Request& req);
void send_json(httplib::Response& res, int status, const nlohmann::ordered_json& body);

// routes_generate.cpp
void handle_completions(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_chat_completions(ServerState& state, const httplib::Request& req,
                             httplib::Response& res);

// routes_info.cpp
void handle_models(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_health(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_metrics(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_tokenize(ServerState& state, const httplib::Request& req, httplib::Response& res);
void handle_detokenize(ServerState& state, const httplib::Request& req, httplib::Response& res);

}  // namespace attnres::server::http
