#include "clients/bench/sse_parser.h"

namespace attnres::bench {

std::vector<std::string> SseParser::feed(std::string_view bytes) {
  for (char c : bytes) {
    if (last_was_cr_) {
      last_was_cr_ = false;
      if (c == '\n') continue;  // the "\n" of a "\r\n"
    }
    if (c == '\r') {
      last_was_cr_ = true;
      end_line();
    } else if (c == '\n') {
      end_line();
    } else {
      line_ += c;
    }
  }
  std::vector<std::string> out;
  out.swap(ready_);
  return out;
}

void SseParser::end_line() {
  if (line_.empty()) {  // a blank line: dispatch
    if (has_data_) ready_.push_back(std::move(data_));
    data_.clear();
    has_data_ = false;
    return;
  }
  if (line_[0] != ':') {  // ":" starts a comment
    const size_t colon = line_.find(':');
    const std::string field = line_.substr(0, colon);
    if (field == "data") {
      std::string value;
      if (colon != std::string::npos) {
        size_t start = colon + 1;
        if (start < line_.size() && line_[start] == ' ') ++start;
        value = line_.substr(start);
      }
      if (has_data_) data_ += '\n';
      data_ += value;
      has_data_ = true;
    }
  }
  line_.clear();
}

}  // namespace attnres::bench
