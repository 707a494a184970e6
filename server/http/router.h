// The route table of the OpenAI-compatible API (API.md) and the rules every route shares:
// 404 / 405 for unknown routes, the API key on every route but /health and /metrics, and
// every failure sent as the OpenAI error envelope with its status (and counted in /metrics).
// Knows nothing of sockets: http_connection.cpp hands it parsed requests.
#pragma once

#include <string>

#include "server/common/server_state.h"
#include "server/http/http_message.h"

namespace attnres::server::http {

using Handler = void (*)(ServerState&, const HttpRequest&, HttpResponse&);

struct Route {
  Handler handler = nullptr;
  bool needs_key = true;  // false: open without an API key (load balancers, Prometheus)
  // Quick and never blocking: answered on the connection's I/O thread, so probes are answered
  // however busy the request workers are. Others run on the worker pool.
  bool on_io_thread = false;
};

class Router {
 public:
  explicit Router(ServerState& state) : state_(state) {}

  // The route for the request; null (and `error` set to the 404 or 405) when there is none.
  const Route* find(const HttpRequest& request, HttpResponse& error) const;
  // Checks the API key, runs the handler, and turns what it throws into an error response:
  // ApiError -> its status, RequestError -> its status, attnres::Error -> 400, anything else
  // -> 500.
  HttpResponse run(const Route& route, const HttpRequest& request) const;

  ServerState& state() const { return state_; }

 private:
  ServerState& state_;
};

// Fills `res` with the error envelope (and Retry-After on a 503).
void send_error(HttpResponse& res, int status, const std::string& message,
                const std::string& param = "", const std::string& code = "");

}  // namespace attnres::server::http
