// An incremental parser for Server-Sent Events (the WHATWG "text/event-stream" format), fed
// the response body in whatever pieces the socket delivers. It follows the specification
// rather than assuming the server's framing: lines end with "\n", "\r\n" or "\r" (also split
// across pieces), an empty line dispatches the event, "data:" lines (one optional space after
// the colon) are joined with "\n", comment lines (":" first) and other fields are ignored,
// and an event still unterminated when the stream ends is dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace attnres::bench {

class SseParser {
 public:
  // Appends bytes; returns the data of every event completed by them, in order.
  std::vector<std::string> feed(std::string_view bytes);

 private:
  void end_line();

  std::string line_;
  std::string data_;
  bool has_data_ = false;
  bool last_was_cr_ = false;  // a "\r" ended the previous piece: skip a "\n" that follows
  std::vector<std::string> ready_;
};

}  // namespace attnres::bench
