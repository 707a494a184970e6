// Runs the benchmark's requests against a ServingBackend the way vLLM's benchmark()
// (vllm/benchmarks/serve.py) does:
//   - warm-up: num_warmups copies of the first prompt, at most max_concurrency at once,
//     not measured;
//   - then each request "arrives" at its arrival_times() offset and waits, in arrival order,
//     for one of max_concurrency slots (vLLM's semaphore; unlimited when unset); its
//     queue_time is that wait, its start_time the moment it is sent;
//   - the duration runs from the first arrival slot to the end of the last request.
// Multi-turn (turns > 1): the prompts are conversations of `turns` prompts each (prompt
// c * turns + k is turn k of conversation c); a conversation arrives, takes a slot, and sends
// its turns one after another in that slot, turn k carrying turns < k and their answers as
// history; a failed turn fails the rest of its conversation. Arrivals are per conversation.
// Threads: the calling thread dispatches arrivals; one worker per concurrency slot (one per
// request when unlimited) sends requests, so a slow request never delays another's arrival.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "clients/bench/bench_types.h"
#include "clients/bench/serving_backend.h"

namespace attnres::bench {

struct RunOptions {
  double request_rate = 1.0 / 0.0;  // inf: all at once
  double burstiness = 1.0;
  uint64_t seed = 0;
  std::optional<int> max_concurrency;
  int num_warmups = 0;
  int turns = 1;  // prompts per conversation (--multi-turn)
  bool progress = false;  // a progress bar on stderr
};

struct RunResult {
  std::vector<RequestOutput> outputs;  // in prompt order; start_time relative to the run start
  double duration_s = 0;
  int warmup_failures = 0;
  std::string first_warmup_error;
};

// Throws attnres::Error naming the flag for options run_benchmark() would refuse.
void check_run_options(const RunOptions& options);

RunResult run_benchmark(ServingBackend& backend, const std::vector<BenchPrompt>& prompts,
                        const RequestSettings& settings, const RunOptions& options);

}  // namespace attnres::bench
