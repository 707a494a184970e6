// Turns a streamed response into a RequestOutput, with vLLM's timing rules
// (vllm/benchmarks/lib/endpoint_request_func.py, async_request_openai_completions and
// async_request_openai_chat_completions):
//   - a "chunk" is an event whose `choices` is non-empty (its text may be empty, e.g. the chat
//     stream's first {"role": "assistant", "content": ""} delta, sent after prefill); the
//     trailing usage event (`choices: []`) is not one;
//   - TTFT = first chunk - send; ITL = the gaps between successive chunks;
//     E2EL (latency) = last chunk - send (the usage event and [DONE] do not extend it);
//   - output tokens and prompt tokens come from the usage event, and the prefix-cache hit from
//     its prompt_tokens_details.cached_tokens when the server reports it; usage carried by a
//     chunk (llama-server puts it on the last one) counts too, where vLLM's client misses it.
// Stricter than vLLM, which counts any stream with one chunk as a success: an in-band
// `{"error": ...}` event, a body that is not JSON, or a stream that ends without
// `data: [DONE]` or without usage make the request fail with that reason.
// gRPC uses ChunkTimer directly (a GenerateStreamChunk is a chunk).
#pragma once

#include <string>

#include "clients/bench/bench_types.h"

namespace attnres::bench {

// vLLM's TTFT / ITL / latency bookkeeping; times on one clock, in seconds.
class ChunkTimer {
 public:
  explicit ChunkTimer(double sent_at) : sent_at_(sent_at), last_(sent_at) {}
  void on_chunk(double now, RequestOutput& out);
  bool any() const { return any_; }
  // latency = last chunk - send.
  void finish(RequestOutput& out) const { out.latency = last_ - sent_at_; }

 private:
  double sent_at_;
  double last_;
  bool any_ = false;
};

enum class OpenAiApi { kCompletions, kChatCompletions };

class OpenAiStreamRecorder {
 public:
  OpenAiStreamRecorder(OpenAiApi api, double sent_at, RequestOutput& out)
      : api_(api), timer_(sent_at), out_(out) {}
  // One SSE event's data, received at `now`.
  void on_event(const std::string& data, double now);
  // After the body ended: sets success / error / latency.
  void finish();
  bool failed() const { return !error_.empty(); }

 private:
  OpenAiApi api_;
  ChunkTimer timer_;
  RequestOutput& out_;
  bool done_ = false;
  bool usage_ = false;
  std::string error_;
};

// Checks the lengths the server reported against the prompt's: the prompt must be counted as
// prompt.prompt_len tokens, and with ignore_eos exactly prompt.output_len tokens must come back
// (without it, 1 to output_len); a prompt_len of 0 (a later turn) is not checked. A mismatch marks a successful output failed, with the numbers.
void check_lengths(const BenchPrompt& prompt, bool ignore_eos, RequestOutput& out);

}  // namespace attnres::bench
