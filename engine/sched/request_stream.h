// What a front-end thread holds for one submitted request: a queue of output deltas the engine
// thread fills, read with a blocking (or timed) next(), and cancel(). The front end never
// touches engine state; the engine never waits on the front end (pushes never block).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/core/depth_attention.h"
#include "engine/sample/logprobs.h"
#include "engine/sample/stop_checker.h"
#include "engine/sched/sequence.h"

namespace attnres {

// One step's news for one choice of a request.
struct RequestOutput {
  int choice_index = 0;
  std::vector<int32_t> token_ids;      // generated since this choice's previous output
  std::string text;                    // text that became final since then (may be empty
                                       // while a possible stop string is held back)
  std::vector<TokenLogprob> logprobs;  // one per token id when params.logprobs >= 0
  // When params.prompt_logprobs >= 0: one entry per prompt token (position 0 has none), sent
  // with each choice's first output. Empty otherwise.
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;
  // Depth-attention weights (params.wants_depth_attention(); layout: EngineCore::
  // depth_attention_layout()). The mean over the prompt positions, once per choice, with its
  // first output; and with depth_attention_per_token one matrix per token id of this output:
  // generated token k's comes from the forward of position num_prompt_tokens + k - 1.
  std::optional<DepthAttentionMatrix> depth_prompt_mean;
  // With the choice's first output: its prompt tokens that came from the prefix cache.
  std::optional<int> cached_prompt_tokens;
  std::vector<DepthAttentionMatrix> depth_per_token;
  FinishReason finish_reason = FinishReason::None;  // set on the choice's last output
  std::optional<std::string> stop_string;           // vLLM's stop_reason, when one matched
  std::optional<int32_t> stop_token;
  std::string error;             // non-empty: the engine ended the choice (finish_reason is Abort)
  EngineClock::time_point time;  // when the engine produced it: TTFT and inter-token latency

  bool finished() const { return finish_reason != FinishReason::None; }
};

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;  // all choices together, as OpenAI counts them
  // Prompt tokens served from the prefix cache when the request was first scheduled (choice
  // 0's): OpenAI's usage.prompt_tokens_details.cached_tokens.
  int cached_tokens = 0;
  int total_tokens() const { return prompt_tokens + completion_tokens; }
};

// Per-request timestamps for the server's latency histograms (queue time = first_scheduled -
// arrival, TTFT = first_token - arrival, e2e = finished - arrival).
struct RequestTimings {
  EngineClock::time_point arrival;
  std::optional<EngineClock::time_point> first_scheduled;
  std::optional<EngineClock::time_point> first_token;
  std::optional<EngineClock::time_point> finished;
};

// Called on the engine thread after each output or the end is pushed, so an event-driven front
// end can wake without polling. It must be quick and must not block (post to an event loop,
// notify a condition variable).
using StreamListener = std::function<void()>;

// The state the engine thread and the front-end thread share for one request.
class StreamChannel {
 public:
  explicit StreamChannel(StreamListener listener = {}) : listener_(std::move(listener)) {}

  // Engine side.
  void push(RequestOutput output);
  // After the last output of the last choice: the stream ends once it is read.
  void close(const Usage& usage, const RequestTimings& timings);

  // Front-end side: see RequestStream.
  enum class Poll { Output, Timeout, Ended };
  Poll next_until(std::optional<EngineClock::time_point> deadline, RequestOutput& out);
  Poll try_next(RequestOutput& out);  // never waits: Timeout when nothing is there yet
  bool closed() const;
  Usage usage() const;
  RequestTimings timings() const;

 private:
  void notify();

  const StreamListener listener_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<RequestOutput> outputs_;
  bool closed_ = false;
  Usage usage_;
  RequestTimings timings_;
};

class RequestStream {
 public:
  using Poll = StreamChannel::Poll;

  RequestStream(std::string request_id, std::shared_ptr<StreamChannel> channel,
                std::function<void(const std::string&)> abort);
  // Cancels the request if it has not ended (a dropped handle must not leak KV blocks).
  ~RequestStream();
  RequestStream(const RequestStream&) = delete;
  RequestStream& operator=(const RequestStream&) = delete;

  // Blocks until the next output; std::nullopt once every choice has finished and every
  // output has been read.
  std::optional<RequestOutput> next();
  // Waits at most `timeout` (to poll for a client disconnect between outputs).
  Poll next_for(std::chrono::milliseconds timeout, RequestOutput& out);
  // Never waits: an output, Ended, or Timeout when nothing is there yet (the request's
  // listener, EngineRequest::listener, says when to look again).
  Poll try_next(RequestOutput& out) { return channel_->try_next(out); }

  // Asks the engine to abort the request; it frees the KV blocks within a step and ends each
  // unfinished choice with an Abort output. Safe to call at any time, more than once.
  void cancel();

  const std::string& request_id() const { return request_id_; }
  bool ended() const { return channel_->closed(); }  // the engine is done with it
  // Final once ended().
  Usage usage() const { return channel_->usage(); }
  RequestTimings timings() const { return channel_->timings(); }

 private:
  std::string request_id_;
  std::shared_ptr<StreamChannel> channel_;
  std::function<void(const std::string&)> abort_;
};

}  // namespace attnres
