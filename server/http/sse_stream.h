// Server-sent events as the OpenAI API frames them: every event is exactly
// "data: <json>\n\n" and the stream ends with "data: [DONE]\n\n". Also the loop that feeds a
// Generation's outputs to a writer while watching the client.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "server/http/client_connection.h"
#include "server/http/generation.h"
#include "server/http/openai_responses.h"

namespace attnres::server::http {

inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

std::string sse_event(const Json& data);

// Writes events to the client; false once a write failed (the client is gone).
class SseWriter {
 public:
  using WriteFn = std::function<bool(const char* data, size_t size)>;
  explicit SseWriter(WriteFn write) : write_(std::move(write)) {}

  bool event(const Json& data) { return raw(sse_event(data)); }
  bool done() { return raw(kSseDone); }
  // An error after the stream started: in-band, then [DONE].
  bool error(const Json& error_envelope) { return event(error_envelope) && done(); }
  bool ok() const { return ok_; }

 private:
  bool raw(std::string_view bytes);
  WriteFn write_;
  bool ok_ = true;
};

// How often a generation waiting on the engine checks whether its client is still there.
inline constexpr std::chrono::milliseconds kClientPollInterval{50};

enum class DriveResult { Finished, ClientGone };

// Hands every output of `generation` to `on_output` until all choices ended. Between outputs
// it probes `client`; when the client left (or on_output returns false because a write
// failed) the generation is cancelled at once and ClientGone is returned.
DriveResult drive_generation(Generation& generation, const ClientConnection& client,
                             const std::function<bool(const RequestOutput&)>& on_output);

}  // namespace attnres::server::http
