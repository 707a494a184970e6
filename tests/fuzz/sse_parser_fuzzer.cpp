// bench serve's Server-Sent Events parser fed arbitrary bytes in arbitrary pieces: the events
// must not depend on how the stream was split (the first byte seeds the split points).
#include <cstdlib>
#include <string>
#include <vector>

#include "clients/bench/sse_parser.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const unsigned step = 1 + data[0] % 7;
  const std::string_view body = attnres::fuzz::as_text(data + 1, size - 1);
  attnres::bench::SseParser whole;
  const std::vector<std::string> once = whole.feed(body);
  attnres::bench::SseParser pieces;
  std::vector<std::string> split;
  for (size_t i = 0; i < body.size(); i += step) {
    for (std::string& e : pieces.feed(body.substr(i, step))) split.push_back(std::move(e));
  }
  if (once != split) std::abort();  // the framing changed the events: a parser bug
  return 0;
}
