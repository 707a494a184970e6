// The OpenAI-compatible HTTP server (API.md), event-driven on Boost.Asio / Beast: a few I/O
// threads hold every connection (an idle or slow client costs a socket and a few KB, not a
// thread), a small worker pool runs the handlers that parse and tokenize, and the engine's
// outputs reach streams through the request's Generation without polling.
#pragma once

#include <cstddef>
#include <memory>

#include "server/common/server_state.h"
#include "server/http/http_limits.h"

namespace attnres::server {

class HttpServer {
 public:
  explicit HttpServer(ServerState& state, http::HttpLimits limits = {});
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds options().host:http_port (0 = any free port) and serves on its own threads; throws
  // attnres::Error naming host:port if it cannot bind.
  void start();
  int port() const;  // the bound port
  // The connection limit in force (HttpLimits::max_connections, lowered to fit the
  // process's file-descriptor limit at start()).
  size_t max_connections() const;
  // Stops listening, closes every connection and joins the threads; called at shutdown after
  // the engine drained.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnres::server
