// Server-sent events as the OpenAI API frames them: every event is exactly
// "data: <json>\n\n" and the stream ends with "data: [DONE]\n\n".
#pragma once

#include <string>
#include <string_view>

#include "server/http/openai_responses.h"

namespace attnres::server::http {

inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

std::string sse_event(const Json& data);

// Appends events to the bytes a connection sends next.
class SseWriter {
 public:
  explicit SseWriter(std::string& out) : out_(out) {}

  void event(const Json& data) { out_ += sse_event(data); }
  void done() { out_ += kSseDone; }
  // An error after the stream started: in-band, then [DONE].
  void error(const Json& error_envelope) {
    event(error_envelope);
    done();
  }

 private:
  std::string& out_;
};

}  // namespace attnres::server::http
