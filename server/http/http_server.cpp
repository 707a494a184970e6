#include "server/http/http_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <exception>
#include <functional>
#include <iostream>
#include <thread>

#include "engine/core/error.h"
#include "server/http/api_error.h"
#include "server/http/routes.h"

namespace attnres::server {
namespace {

using http::ApiError;
using Handler = void (*)(ServerState&, const httplib::Request&, httplib::Response&);

// A streaming request holds a worker thread for its whole life: size the pool for many
// concurrent streams (httplib's default is a handful of threads).
constexpr size_t kWorkerThreads = 512;
constexpr size_t kMaxBodyBytes = 32u << 20;  // larger bodies get 413
constexpr time_t kReadTimeoutSeconds = 30;   // a client that stops sending its request
constexpr time_t kWriteTimeoutSeconds = 30;  // a client that stops reading its stream
constexpr time_t kKeepAliveSeconds = 5;
// httplib listens with a backlog of 5: a burst of clients connecting at once (a benchmark
// starting 256 streams) would overflow it and see resets or 1 s SYN retries.
constexpr int kListenBacklog = 4096;

// Routes open without an API key (load balancers and Prometheus do not send one).
bool is_public_path(const std::string& path) { return path == "/health" || path == "/metrics"; }

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& param = "", const std::string& code = "") {
  res.status = status;
  if (status == 503) res.set_header("Retry-After", "1");
  res.set_content(http::dump_json(http::error_body(status, message, param, code)),
                  "application/json");
}

}  // namespace

struct HttpServer::Impl {
  explicit Impl(ServerState& s) : state(s) {}

  ServerState& state;
  httplib::Server server;
  std::thread thread;
  int port = -1;
  int listen_fd = -1;  // the last socket httplib created to bind (the one that bound)

  // Every handler runs inside this: ApiError -> its status, attnres::Error (bad input found by
  // the tokenizer, the template, the engine's validation) -> 400, anything else -> 500.
  httplib::Server::Handler wrap(Handler handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      try {
        handler(state, req, res);
        return;
      } catch (const ApiError& e) {
        send_error(res, e.status(), e.what(), e.param(), e.code());
      } catch (const Error& e) {
        send_error(res, 400, e.what(), http::field_named_in(e.what()));
      } catch (const std::exception& e) {
        std::cerr << "attnres serve: HTTP " << req.method << " " << req.path
                  << ": internal error: " << e.what() << std::endl;
        send_error(res, 500, std::string("internal error: ") + e.what());
      } catch (...) {
        send_error(res, 500, "internal error");
      }
      state.metrics().record_rejected(res.status);
    };
  }

  void routes() {
    // ---- the OpenAI API ----
    server.Post("/v1/completions", wrap(http::handle_completions));
    server.Post("/v1/chat/completions", wrap(http::handle_chat_completions));
    server.Get("/v1/models", wrap(http::handle_models));
    // ---- vLLM's extras ----
    server.Post("/tokenize", wrap(http::handle_tokenize));
    server.Post("/detokenize", wrap(http::handle_detokenize));
    // ---- operations (no API key) ----
    server.Get("/health", wrap(http::handle_health));
    server.Get("/metrics", wrap(http::handle_metrics));

    // A known path with the wrong method: 405 instead of httplib's 404.
    const auto wrong_method = [](const httplib::Request& req, httplib::Response& res) {
      send_error(res, 405, "method " + req.method + " is not allowed on " + req.path);
    };
    for (const char* path :
         {"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"}) {
      server.Get(path, wrong_method);
      server.Put(path, wrong_method);
      server.Delete(path, wrong_method);
    }
    for (const char* path : {"/v1/models", "/health", "/metrics"}) {
      server.Post(path, wrong_method);
      server.Put(path, wrong_method);
      server.Delete(path, wrong_method);
    }
  }

  void auth() {
    server.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (is_public_path(req.path) || state.options().api_keys.empty()) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      const std::string header = req.get_header_value("Authorization");
      constexpr std::string_view kBearer = "Bearer ";
      // The scheme is case-insensitive (RFC 7235); the key is not.
      const bool has_bearer = header.size() >= kBearer.size() &&
                              std::equal(kBearer.begin(), kBearer.end(), header.begin(),
                                         [](unsigned char a, unsigned char b) {
                                           return std::tolower(a) == std::tolower(b);
                                         });
      if (has_bearer && state.check_api_key(std::string_view(header).substr(kBearer.size()))) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      send_error(res, 401,
                 has_bearer ? "Incorrect API key provided."
                            : "Missing API key: send Authorization: Bearer <key>.",
                 "", "invalid_api_key");
      state.metrics().record_rejected(401);
      return httplib::Server::HandlerResponse::Handled;
    });
  }

  // httplib's own failures (unknown route, 413 body too large, 400 unreadable request) get
  // the OpenAI envelope too; responses that already have a body are left alone.
  void errors() {
    const httplib::Server::HandlerWithResponse on_error = [this](const httplib::Request& req,
                                                                 httplib::Response& res) {
      // 499: a non-streamed request whose client left; nobody reads an answer.
      if (!res.body.empty() || res.status == 499) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      std::string message;
      std::string code;
      switch (res.status) {
        case 404:
          message = "no route " + req.method + " " + req.path;
          code = "not_found";
          break;
        case 413:
          message = "the request body is larger than the server accepts (32 MiB)";
          break;
        default:
          message = "the request could not be read (HTTP " + std::to_string(res.status) + ")";
          break;
      }
      send_error(res, res.status, message, "", code);
      state.metrics().record_rejected(res.status);
      return httplib::Server::HandlerResponse::Handled;
    };
    server.set_error_handler(on_error);
    server.set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
          send_error(res, 500, "internal error");
        });
  }
};

HttpServer::HttpServer(ServerState& state) : impl_(std::make_unique<Impl>(state)) {
  httplib::Server& server = impl_->server;
  server.new_task_queue = [] { return new httplib::ThreadPool(kWorkerThreads); };
  server.set_payload_max_length(kMaxBodyBytes);
  server.set_read_timeout(kReadTimeoutSeconds, 0);
  server.set_write_timeout(kWriteTimeoutSeconds, 0);
  server.set_keep_alive_timeout(kKeepAliveSeconds);
  // Replaces httplib's default options, which add SO_REUSEPORT: with it a second server could
  // bind a port already in use and start() would not fail as it must.
  server.set_socket_options([impl = impl_.get()](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    impl->listen_fd = sock;
  });
  impl_->routes();
  impl_->auth();
  impl_->errors();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  const ServeOptions& options = impl_->state.options();
  httplib::Server& server = impl_->server;
  if (options.http_port == 0) {
    impl_->port = server.bind_to_any_port(options.host);
  } else {
    impl_->port = server.bind_to_port(options.host, options.http_port) ? options.http_port : -1;
  }
  if (impl_->port <= 0) {
    std::string message = "HTTP server: cannot listen on ";
    message += options.host;
    message += ':';
    message += std::to_string(options.http_port);
    message += " (address in use, or not an address of this machine)";
    throw Error(message);
  }
  // Linux applies a second listen() to the listening socket as a new backlog.
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, kListenBacklog);
  impl_->thread = std::thread([&server] { server.listen_after_bind(); });
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::stop() {
  if (!impl_->thread.joinable()) return;
  impl_->server.stop();
  impl_->thread.join();
}

}  // namespace attnres::server
