#include "server/http/http_connection.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "server/http/api_error.h"

namespace attnres::server::http {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

// While a response is in progress the connection keeps reading (to notice a client that
// leaves); a client that pipelines more than this meanwhile is simply not read further.
constexpr size_t kMaxBufferedWhileResponding = 64 * 1024;
// After an error that closes the connection: how long the rest of the request is read and
// dropped, so the client sees the answer instead of a reset (nginx's lingering close).
constexpr std::chrono::milliseconds kLingerTime{2000};

std::string seconds_text(std::chrono::milliseconds ms) {
  return std::to_string(ms.count() / 1000) + " s";
}

std::string status_line(int status) {
  std::string line = "HTTP/1.1 ";
  line += std::to_string(status);
  line += ' ';
  line += std::string(bhttp::obsolete_reason(static_cast<bhttp::status>(status)));
  line += "\r\n";
  return line;
}

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(tcp::socket socket, ConnectionContext& context)
      : socket_(std::move(socket)),
        context_(context),
        limits_(context.limits),
        read_timer_(socket_.get_executor()),
        write_timer_(socket_.get_executor()) {
    context_.open_connections.fetch_add(1);
    context_.metrics.http_connection_opened();
  }

  ~Connection() {
    if (async_) async_->cancel();
    context_.open_connections.fetch_sub(1);
    context_.metrics.http_connection_closed();
  }

  void start() { read_request(); }

  void reject_busy() {
    keep_alive_ = false;
    send_error_and_close(503, "the server holds its maximum of " +
                                  std::to_string(limits_.max_connections) +
                                  " connections; retry later");
  }

 private:
  enum class Phase { Reading, Handling, Responding, Closing, Closed };

  // ---- reading a request ----

  void read_request() {
    phase_ = Phase::Reading;
    timed_out_ = false;
    head_only_ = false;
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(limits_.max_header_bytes));
    parser_->body_limit(limits_.max_body_bytes);
    if (buffer_.size() > 0) {  // a pipelined request already started
      read_header();
      return;
    }
    // Waiting for a request: nothing sent within the idle time closes the connection quietly.
    arm_read_deadline(limits_.idle_timeout, [self = shared_from_this()] { self->close(); });
    socket_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](error_code ec, size_t n) {
                              if (self->phase_ == Phase::Closed) return;
                              if (ec) {
                                self->read_timer_.cancel();
                                self->close();  // the client left (or the server is stopping)
                                return;
                              }
                              self->buffer_.commit(n);
                              self->read_header();
                            });
  }

  // The request's first bytes are in: its header must be complete within the header time,
  // counted from now and not renewed per byte (a slowloris), else 408.
  void read_header() {
    arm_read_deadline(limits_.header_timeout, [self = shared_from_this()] { self->expire_read(); });
    bhttp::async_read_header(
        socket_, buffer_, *parser_,
        [self = shared_from_this()](error_code ec, size_t) { self->on_header(ec); });
  }

  void arm_read_deadline(std::chrono::milliseconds after, std::function<void()> on_expiry) {
    read_timer_.expires_after(after);
    read_timer_.async_wait(
        [self = shared_from_this(), on_expiry = std::move(on_expiry)](error_code ec) {
          if (!ec && self->phase_ == Phase::Reading) on_expiry();
        });
  }

  // The request did not arrive in time: the pending read ends with operation_aborted and
  // its handler answers 408.
  void expire_read() {
    timed_out_ = true;
    error_code ignored;
    socket_.cancel(ignored);
  }

  // A read failed: answers the status the failure calls for, or just closes when the client
  // left. Returns true when it handled `ec`.
  bool read_failed(error_code ec, const char* what, std::chrono::milliseconds deadline) {
    read_timer_.cancel();
    if (phase_ == Phase::Closed) return true;
    if (!ec) return false;
    if (timed_out_) {
      send_error_and_close(408, std::string("the request ") + what + " did not arrive within " +
                                    seconds_text(deadline));
    } else if (ec == bhttp::error::header_limit) {
      send_error_and_close(431, "the request headers are larger than the server accepts (" +
                                    std::to_string(limits_.max_header_bytes / 1024) + " KiB)");
    } else if (ec == bhttp::error::body_limit) {
      send_error_and_close(413, "the request body is larger than the server accepts (" +
                                    std::to_string(limits_.max_body_bytes >> 20) + " MiB)");
    } else if (ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
               ec == asio::error::connection_reset || ec == asio::error::operation_aborted ||
               ec == bhttp::error::partial_message) {
      close();  // the client left (or the server is stopping)
    } else {
      send_error_and_close(400, "the request could not be read: " + ec.message());
    }
    return true;
  }

  void on_header(error_code ec) {
    if (read_failed(ec, "headers", limits_.header_timeout)) return;
    const auto& req = parser_->get();
    if (static_cast<size_t>(std::distance(req.begin(), req.end())) > limits_.max_header_fields) {
      send_error_and_close(431, "the request has more than " +
                                    std::to_string(limits_.max_header_fields) + " header fields");
      return;
    }
    keep_alive_ = req.keep_alive();
    if (parser_->is_done()) {
      on_body({});
      return;
    }
    // curl and others wait for this before sending a large body.
    if (beast::iequals(req[bhttp::field::expect], "100-continue")) {
      queue_write("HTTP/1.1 100 Continue\r\n\r\n");
    }
    arm_read_deadline(limits_.body_timeout, [self = shared_from_this()] { self->expire_read(); });
    bhttp::async_read(socket_, buffer_, *parser_,
                      [self = shared_from_this()](error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(error_code ec) {
    if (read_failed(ec, "body", limits_.body_timeout)) return;
    auto message = parser_->release();
    HttpRequest request;
    request.method = std::string(message.method_string());
    const std::string_view target(message.target().data(), message.target().size());
    request.path = std::string(target.substr(0, target.find('?')));
    for (const auto& field : message) {
      request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
    }
    request.body = std::move(message.body());
    head_only_ = request.method == "HEAD";
    dispatch(std::move(request));
  }

  // ---- handling it ----

  void dispatch(HttpRequest request) {
    phase_ = Phase::Handling;
    HttpResponse error;
    const Route* route = context_.router.find(request, error);
    if (route == nullptr) {
      respond(std::move(error));
      return;
    }
    if (route->on_io_thread) {
      respond(context_.router.run(*route, request));
      return;
    }
    asio::post(context_.workers,
               [self = shared_from_this(), route, request = std::move(request)]() mutable {
                 HttpResponse res = self->context_.router.run(*route, request);
                 asio::post(self->socket_.get_executor(), [self, res = std::move(res)]() mutable {
                   self->respond(std::move(res));
                 });
               });
  }

  void respond(HttpResponse res) {
    if (phase_ == Phase::Closed) return;  // closed while the handler ran
    phase_ = Phase::Responding;
    if (!res.async) {
      queue_write(serialize(res));
      response_complete_ = true;
      after_write();
      return;
    }
    async_ = std::move(res.async);
    if (async_->streamed()) {
      // HTTP/1.0 has no chunked encoding: the body ends when the connection closes.
      chunked_ = parser_->get().version() >= 11;
      if (!chunked_) keep_alive_ = false;
      queue_write(stream_head(res));
    }
    // Called on the engine thread: posts to this connection's strand and never keeps the
    // connection alive from there.
    async_->set_wake([executor = socket_.get_executor(), weak = weak_from_this()] {
      asio::post(executor, [weak] {
        if (auto self = weak.lock()) self->pump();
      });
    });
    watch_client();
    pump();
  }

  // Takes the generation's news and queues it for the client.
  void pump() {
    if (!async_ || phase_ != Phase::Responding) return;
    std::string chunk;
    HttpResponse whole;
    bool done = false;
    try {
      done = async_->pump(chunk, whole);
    } catch (const std::exception& e) {
      std::cerr << "attnres serve: HTTP response failed: " << e.what() << std::endl;
      done = true;
      if (async_->streamed()) {
        keep_alive_ = false;  // the stream ends without its terminator: the client sees a cut
        chunk.clear();
        chunked_ = false;
      } else {
        send_error(whole, 500, std::string("internal error: ") + e.what());
      }
    }
    if (async_->streamed()) {
      if (!chunk.empty()) queue_write(chunked_ ? chunk_frame(chunk) : chunk);
      if (done && chunked_) queue_write("0\r\n\r\n");
    } else if (done) {
      queue_write(serialize(whole));
    }
    if (done) {
      async_.reset();  // ends the generation: its metrics are recorded now
      response_complete_ = true;
      after_write();
    }
  }

  // ---- noticing a client that leaves mid-response ----

  void watch_client() {
    if (watching_ || buffer_.size() >= kMaxBufferedWhileResponding) return;
    watching_ = true;
    socket_.async_read_some(
        buffer_.prepare(4096), [self = shared_from_this()](error_code ec, size_t n) {
          self->watching_ = false;
          if (self->phase_ == Phase::Closed) return;
          if (self->resume_reading_) {  // the response finished; the next request may start
            self->resume_reading_ = false;
            if (ec && ec != asio::error::operation_aborted) {
              self->close();
              return;
            }
            if (!ec) self->buffer_.commit(n);
            self->read_request();
            return;
          }
          if (ec) {
            self->close();  // EOF or reset: the client is gone; its generation is cancelled
            return;
          }
          self->buffer_.commit(n);  // a pipelined next request: kept for read_request()
          self->watch_client();
        });
  }

  // ---- writing ----

  // The status line and headers; `framing` is Content-Length or Transfer-Encoding (or none).
  std::string head(const HttpResponse& res, const std::string& framing) const {
    std::string out = status_line(res.status);
    out += "Server: attnres\r\n";
    if (!res.content_type.empty()) out += "Content-Type: " + res.content_type + "\r\n";
    out += framing;
    for (const auto& [name, value] : res.headers) out += name + ": " + value + "\r\n";
    if (!keep_alive_) out += "Connection: close\r\n";
    out += "\r\n";
    return out;
  }

  std::string serialize(const HttpResponse& res) const {
    std::string out = head(res, "Content-Length: " + std::to_string(res.body.size()) + "\r\n");
    if (!head_only_) out += res.body;
    return out;
  }

  std::string stream_head(const HttpResponse& res) const {
    return head(res, chunked_ ? "Transfer-Encoding: chunked\r\n" : "");
  }

  static std::string chunk_frame(const std::string& data) {
    char size[20];
    std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
    std::string out = size;
    out += data;
    out += "\r\n";
    return out;
  }

  void queue_write(const std::string& bytes) {
    pending_ += bytes;
    if (!write_in_flight_) start_write();
  }

  void start_write() {
    if (pending_.empty() || phase_ == Phase::Closed) return;
    writing_ = std::move(pending_);
    pending_.clear();
    write_in_flight_ = true;
    write_timer_.expires_after(limits_.write_timeout);
    write_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec) self->close();  // the client stopped reading
    });
    asio::async_write(socket_, asio::buffer(writing_),
                      [self = shared_from_this()](error_code ec, size_t) {
                        self->write_in_flight_ = false;
                        self->write_timer_.cancel();
                        if (ec) {
                          self->close();
                          return;
                        }
                        if (!self->pending_.empty()) {
                          self->start_write();
                          return;
                        }
                        self->after_write();
                      });
  }

  // Everything queued has been written: the next step once the response is complete.
  void after_write() {
    if (write_in_flight_ || !pending_.empty() || !response_complete_) return;
    if (phase_ == Phase::Closing) {
      linger();
      return;
    }
    if (phase_ != Phase::Responding) return;
    response_complete_ = false;
    if (!keep_alive_) {
      close();
      return;
    }
    if (watching_) {
      // The watch read must end before the next request's read starts.
      resume_reading_ = true;
      error_code ignored;
      socket_.cancel(ignored);
      return;
    }
    read_request();
  }

  // ---- errors and closing ----

  void send_error_and_close(int status, const std::string& message) {
    context_.metrics.record_rejected(status);
    HttpResponse res;
    send_error(res, status, message);
    keep_alive_ = false;
    phase_ = Phase::Closing;
    queue_write(serialize(res));
    response_complete_ = true;
    after_write();
  }

  // The answer is out: stop sending, drop what the client still sends for a moment, close.
  void linger() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    read_timer_.expires_after(kLingerTime);
    read_timer_.async_wait([self = shared_from_this()](error_code ec) {
      if (!ec) self->close();
    });
    drain();
  }

  void drain() {
    socket_.async_read_some(asio::buffer(drain_buffer_),
                            [self = shared_from_this()](error_code ec, size_t) {
                              if (ec) {
                                self->close();
                                return;
                              }
                              self->drain();
                            });
  }

  void close() {
    if (phase_ == Phase::Closed) return;
    phase_ = Phase::Closed;
    if (async_) {
      async_->cancel();
      async_.reset();
    }
    read_timer_.cancel();
    write_timer_.cancel();
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  tcp::socket socket_;
  ConnectionContext& context_;
  const HttpLimits& limits_;
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  Phase phase_ = Phase::Reading;
  bool timed_out_ = false;
  bool keep_alive_ = true;
  bool head_only_ = false;
  bool chunked_ = true;
  std::shared_ptr<AsyncBody> async_;
  bool response_complete_ = false;
  std::string pending_;  // queued, not yet handed to the socket
  std::string writing_;  // being written
  bool write_in_flight_ = false;
  bool watching_ = false;
  bool resume_reading_ = false;
  char drain_buffer_[4096];
};

}  // namespace

void serve_connection(tcp::socket socket, ConnectionContext& context, bool over_limit) {
  auto connection = std::make_shared<Connection>(std::move(socket), context);
  if (over_limit) {
    connection->reject_busy();
  } else {
    connection->start();
  }
}

}  // namespace attnres::server::http
