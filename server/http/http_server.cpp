#include "server/http/http_server.h"

#include <sys/resource.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <iostream>
#include <thread>
#include <vector>

#include "engine/core/error.h"
#include "server/http/http_connection.h"

namespace attnres::server {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using boost::system::error_code;

// Threads that run the event loop (sockets, timers, SSE formatting): every connection is a
// state machine on one of them, so a few serve thousands of connections.
constexpr int kIoThreads = 2;
// Threads that run the handlers that parse JSON, render chat templates, tokenize and submit.
constexpr int kRequestWorkers = 4;
constexpr int kListenBacklog = 4096;
// File descriptors kept back from the connection limit for the checkpoint, gRPC and logs.
constexpr rlim_t kReservedDescriptors = 256;

// Raises the soft descriptor limit to the hard one (as nginx and vLLM do: thousands of idle
// clients each hold one) and returns the connections it leaves room for.
size_t connections_the_fd_limit_allows(size_t wanted) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return wanted;
  if (limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
    getrlimit(RLIMIT_NOFILE, &limit);
  }
  if (limit.rlim_cur == RLIM_INFINITY) return wanted;
  if (limit.rlim_cur <= kReservedDescriptors * 2) return limit.rlim_cur / 2;
  return std::min<size_t>(wanted, limit.rlim_cur - kReservedDescriptors);
}

}  // namespace

struct HttpServer::Impl {
  Impl(ServerState& s, http::HttpLimits l)
      : state(s),
        limits(l),
        router(s),
        workers(kRequestWorkers),
        context{router, limits, workers, s.metrics()},
        acceptor(io),
        retry_timer(io) {}

  void accept() {
    acceptor.async_accept(asio::make_strand(io), [this](error_code ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
      if (ec) {
        // Out of descriptors (EMFILE) or memory: the pending client stays in the backlog;
        // try again shortly instead of spinning.
        if (!warned_accept) {
          std::cerr << "attnres serve: HTTP accept failed: " << ec.message()
                    << " (connections are refused until some close)" << std::endl;
          warned_accept = true;
        }
        retry_timer.expires_after(std::chrono::milliseconds(50));
        retry_timer.async_wait([this](error_code wait_ec) {
          if (!wait_ec) accept();
        });
        return;
      }
      warned_accept = false;
      error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      const bool over_limit = context.open_connections.load() >= limits.max_connections;
      http::serve_connection(std::move(socket), context, over_limit);
      accept();
    });
  }

  ServerState& state;
  http::HttpLimits limits;
  http::Router router;
  asio::thread_pool workers;
  http::ConnectionContext context;
  asio::io_context io;
  tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  std::vector<std::thread> threads;
  bool warned_accept = false;
  int port = -1;
};

HttpServer::HttpServer(ServerState& state, http::HttpLimits limits)
    : impl_(std::make_unique<Impl>(state, limits)) {}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  const ServeOptions& options = impl_->state.options();
  impl_->limits.max_connections = connections_the_fd_limit_allows(impl_->limits.max_connections);
  error_code ec;
  const asio::ip::address address = asio::ip::make_address(options.host, ec);
  tcp::acceptor& acceptor = impl_->acceptor;
  if (!ec) {
    const tcp::endpoint endpoint(address, static_cast<unsigned short>(options.http_port));
    acceptor.open(endpoint.protocol(), ec);
    // Not SO_REUSEPORT: a second server must fail to bind a port already in use.
    if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(kListenBacklog, ec);
  }
  if (ec) {
    error_code ignored;
    acceptor.close(ignored);
    std::string message = "HTTP server: cannot listen on ";
    message += options.host;
    message += ':';
    message += std::to_string(options.http_port);
    message += " (" + ec.message() + ": address in use, or not an address of this machine)";
    throw Error(message);
  }
  impl_->port = acceptor.local_endpoint().port();
  impl_->accept();
  for (int i = 0; i < kIoThreads; ++i) {
    impl_->threads.emplace_back([impl = impl_.get()] { impl->io.run(); });
  }
}

int HttpServer::port() const { return impl_->port; }

size_t HttpServer::max_connections() const { return impl_->limits.max_connections; }

void HttpServer::stop() {
  if (impl_->threads.empty()) return;
  asio::post(impl_->io, [impl = impl_.get()] {
    error_code ignored;
    impl->acceptor.close(ignored);
    impl->retry_timer.cancel();
  });
  impl_->io.stop();
  for (std::thread& t : impl_->threads) t.join();
  impl_->threads.clear();
  impl_->workers.join();
}

}  // namespace attnres::server
