// What one HTTP client may cost the server, and how long it may take to send its request.
// A connection past a limit gets the status named here (counted in /metrics under
// attnres:requests_rejected_total{status=...}) and is closed.
#pragma once

#include <chrono>
#include <cstddef>

namespace attnres::server::http {

struct HttpLimits {
  size_t max_header_bytes = 16 * 1024;  // request line + headers; more: 431
  size_t max_header_fields = 100;       // more: 431
  size_t max_body_bytes = 32u << 20;    // more: 413
  // Open connections at once; one more is answered 503 and closed. start() lowers it to fit
  // the process's file-descriptor limit.
  size_t max_connections = 32768;
  // A connection waiting for its next request with nothing sent is closed after this
  // (keep-alive, and a new connection that sends nothing); the client may reconnect.
  std::chrono::milliseconds idle_timeout{5000};
  // The request line and headers must arrive within this of the request's first byte, not
  // renewed per byte (a slowloris sending a byte at a time): 408.
  std::chrono::milliseconds header_timeout{10000};
  // The body must arrive within this after the headers: 408.
  std::chrono::milliseconds body_timeout{60000};
  // A client that stops reading: a write that does not finish within this closes the
  // connection (and cancels its request).
  std::chrono::milliseconds write_timeout{30000};
};

}  // namespace attnres::server::http
