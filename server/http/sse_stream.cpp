#include "server/http/sse_stream.h"

#include "server/http/api_error.h"

namespace attnres::server::http {

std::string sse_event(const Json& data) {
  std::string event = "data: ";
  event += dump_json(data);
  event += "\n\n";
  return event;
}

}  // namespace attnres::server::http
