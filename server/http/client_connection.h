// Noticing that an HTTP client went away while its request is still generating, so the
// request can be cancelled at once (its KV blocks freed) instead of running to max_tokens.
//
// cpp-httplib 0.11 does not hand the handler its socket, and writing to a dead connection
// only fails once the peer's RST came back, which needs a token to write. So the socket is
// found by its addresses (the handler knows both ends) and probed between tokens: a peer
// that closed or half-closed its side makes the socket readable with end-of-file.
#pragma once

#include <string>

namespace attnres::server::http {

class ClientConnection {
 public:
  // Looks the socket up among this process's descriptors (-1 when not found: closed()
  // then always answers false and the caller relies on write failures).
  ClientConnection(const std::string& local_addr, int local_port, const std::string& remote_addr,
                   int remote_port);

  // True once the peer closed the connection (EOF, reset or error on the socket). Never
  // blocks, never consumes data.
  bool closed() const;

  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

}  // namespace attnres::server::http
