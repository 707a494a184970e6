#include "server/http/sse_stream.h"

#include "server/http/api_error.h"

namespace attnres::server::http {

std::string sse_event(const Json& data) {
  std::string event = "data: ";
  event += dump_json(data);
  event += "\n\n";
  return event;
}

bool SseWriter::raw(std::string_view bytes) {
  if (!ok_) return false;
  ok_ = write_(bytes.data(), bytes.size());
  return ok_;
}

DriveResult drive_generation(Generation& generation, const ClientConnection& client,
                             const std::function<bool(const RequestOutput&)>& on_output) {
  RequestOutput out;
  for (;;) {
    switch (generation.next(kClientPollInterval, out)) {
      case RequestStream::Poll::Ended:
        return DriveResult::Finished;
      case RequestStream::Poll::Timeout:
        break;
      case RequestStream::Poll::Output:
        if (!on_output(out)) {
          generation.cancel();
          return DriveResult::ClientGone;
        }
        break;
    }
    // Probed after every output too: a non-streamed request has no writes to fail.
    if (client.closed()) {
      generation.cancel();
      return DriveResult::ClientGone;
    }
  }
}

}  // namespace attnres::server::http
