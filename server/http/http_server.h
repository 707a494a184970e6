// The OpenAI-compatible HTTP server (shared/design/API.md) on cpp-httplib: routes, auth, the
// error envelope, and the thread pool that lets hundreds of streams run at once.
#pragma once

#include <memory>

#include "server/common/server_state.h"

namespace attnres::server {

class HttpServer {
 public:
  explicit HttpServer(ServerState& state);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds options().host:http_port (0 = any free port) and serves on its own threads; throws
  // attnres::Error naming host:port if it cannot bind.
  void start();
  int port() const;  // the bound port
  // Stops listening and joins the server threads; called at shutdown after the engine drained.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace attnres::server
