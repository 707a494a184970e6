// The small request/response types the routes see, so that route code knows nothing of the
// HTTP library (server/http/http_connection.cpp speaks the protocol with Boost.Beast).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace attnres::server::http {

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // the target without its query string
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  // The first header of that name (case-insensitive), nullopt when absent.
  std::optional<std::string_view> header(std::string_view name) const;
};

struct HttpResponse;

// A body that comes later, from a generation: the connection drives it on its own thread.
// Streamed: the 200 and the event-stream headers go out at once, then chunks as they come.
// Not streamed: the whole response (status included) is known only at the end.
class AsyncBody {
 public:
  virtual ~AsyncBody() = default;
  virtual bool streamed() const = 0;
  // `wake` may be called from any thread when there is news; the connection then calls
  // pump() on its own thread. Pump once after setting it.
  virtual void set_wake(std::function<void()> wake) = 0;
  // Consumes the news. Streamed: appends the bytes to send to `chunk`. Not streamed: fills
  // `whole` once finished. Returns true when the response is complete.
  virtual bool pump(std::string& chunk, HttpResponse& whole) = 0;
  // The client left: stop generating.
  virtual void cancel() = 0;
};

struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // beyond Content-Type/-Length
  std::shared_ptr<AsyncBody> async;  // set: the body (or the whole response) comes later

  void set_content(std::string content, std::string type) {
    body = std::move(content);
    content_type = std::move(type);
  }
};

}  // namespace attnres::server::http
