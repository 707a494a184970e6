// A hand-computed benchmark timeline shared by the metrics and report tests. Times are
// multiples of 1/4 s, exact in binary, so expected values can be written as decimals.
//
//   request  start  TTFT  ITLs               E2EL  output  prompt
//   A        0.00   0.50  0.25, 0.25, 0.50   1.50  4       10
//   B        0.25   1.00  0.50               1.50  2       10
//   C        0.50   (failed: "HTTP 500: boom")
//   D        1.00   0.25  -                  0.25  1       10
//
// Chunk times (start + TTFT + cumulative ITL): A 0.5 0.75 1.0 1.5, B 1.25 1.75, D 1.25;
// one-second buckets from the first start (0): [0,1) holds 2, [1,2) holds 5.
// Intervals in flight: A [0,1.5), B [0.25,1.75), D [1,1.25): at most 3 at once.
#pragma once

#include <vector>

#include "clients/bench/bench_types.h"

namespace attnres::bench::testing {

inline RequestOutput ok(double start, double ttft, std::vector<double> itl, double latency,
                        int output_tokens, int prompt_len = 10) {
  RequestOutput o;
  o.success = true;
  o.start_time = start;
  o.ttft = ttft;
  o.itl = std::move(itl);
  o.latency = latency;
  o.output_tokens = output_tokens;
  o.prompt_len = prompt_len;
  return o;
}

inline std::vector<RequestOutput> hand_timeline() {
  RequestOutput failed;
  failed.start_time = 0.5;
  failed.prompt_len = 10;
  failed.error = "HTTP 500: boom";
  return {ok(0.0, 0.5, {0.25, 0.25, 0.5}, 1.5, 4), ok(0.25, 1.0, {0.5}, 1.5, 2), failed,
          ok(1.0, 0.25, {}, 0.25, 1)};
}

}  // namespace attnres::bench::testing
