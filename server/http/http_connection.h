// One HTTP/1.1 client connection, event-driven: it costs a socket, a read buffer and a parser
// while idle or slow, never a thread. Reads each request with Boost.Beast's parser under the
// limits of HttpLimits (431 / 413 / 408), hands it to the Router (quick routes on the I/O
// thread, the rest on the request workers), writes the response, and while a generation
// runs keeps a read open so a client that leaves is noticed at once and its request
// cancelled.
#pragma once

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/thread_pool.hpp>
#include <cstddef>

#include "server/common/metrics.h"
#include "server/http/http_limits.h"
#include "server/http/router.h"

namespace attnres::server::http {

// What every connection of one server shares; outlives them all.
struct ConnectionContext {
  const Router& router;
  const HttpLimits& limits;
  boost::asio::thread_pool& workers;  // runs the handlers that parse, tokenize and submit
  Metrics& metrics;
  std::atomic<size_t> open_connections{0};
};

// Serves an accepted socket until the client leaves or a limit closes it. `over_limit`: the
// server already holds limits.max_connections connections; the client gets a 503.
void serve_connection(boost::asio::ip::tcp::socket socket, ConnectionContext& context,
                      bool over_limit);

}  // namespace attnres::server::http
