// The records `attnres bench serve` passes between its parts: one prompt of the synthetic data
// set, and what one request measured. They mirror vLLM's SampleRequest and RequestFuncOutput
// (vllm/benchmarks/datasets/abstractions.py, vllm/benchmarks/lib/endpoint_request_func.py), so
// that the metrics code reads like vLLM's calculate_metrics. Times are in seconds.
#pragma once

#include <string>
#include <vector>

namespace attnres::bench {

// One prompt of the data set, with the lengths the server must report back.
struct BenchPrompt {
  std::string text;    // sent as the completion prompt / the user message / the gRPC text
  int prompt_len = 0;  // tokens the server counts for it (usage.prompt_tokens)
  int output_len = 0;  // max_tokens (with ignore_eos: exactly the tokens generated)
  // Multi-turn: the conversation before this turn, alternating user text and the model's
  // answer (empty for single-turn prompts and turn 0). With history, prompt_len is 0: the
  // server's count depends on the answers, so it is not checked.
  std::vector<std::string> history;
};

// What one request measured (vLLM's RequestFuncOutput).
struct RequestOutput {
  bool success = false;
  std::string error;           // why it failed ("" when it succeeded)
  std::string generated_text;  // the streamed text, concatenated
  int prompt_len = 0;          // usage.prompt_tokens (the requested length until usage arrives)
  int output_tokens = 0;       // usage.completion_tokens (gRPC: GenerateComplete.usage)
  int cached_tokens = -1;      // usage.prompt_tokens_details.cached_tokens; -1: not reported
  int turn = 0;                // multi-turn: the turn this request was (0-based)
  double ttft = 0;             // send -> first chunk carrying a choice (vLLM: TTFT)
  std::vector<double> itl;     // gaps between successive choice chunks (vLLM: ITL)
  double latency = 0;          // send -> last choice chunk (vLLM: E2EL)
  double start_time = 0;       // when it was sent, seconds after the benchmark started
  double queue_time = 0;       // arrival -> sent: the wait for a --max-concurrency slot
};

}  // namespace attnres::bench
