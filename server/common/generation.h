// One front-end request run on the engine, shared by HTTP and gRPC: admission (the server is
// accepting, the engine takes the request), one EngineRequest per prompt (each with n
// choices) read as a single stream whose choice indices continue across prompts (prompt p,
// choice c -> index p * n + c, as OpenAI and vLLM number them), and the request's metrics
// (recorded once per prompt when its stream ends).
//
// No polling: every prompt's stream signals one per-request event. An event-driven front end
// sets a listener (called on the engine thread) and reads with next() when woken; a front
// end with a thread per call blocks in wait_for().
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/sched/engine_core.h"
#include "engine/sched/request_stream.h"
#include "server/common/server_state.h"

namespace attnres::server {

class Generation {
 public:
  // Submits every prompt. On a refusal, cancels those already accepted and throws
  // RequestError (InvalidArgument naming the field, QueueFull, Unavailable).
  Generation(ServerState& state, const std::string& request_id,
             const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params, int n);
  ~Generation();  // cancels what has not ended, records metrics for what has
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // The next output of any prompt if one is ready (round robin, so no prompt starves the
  // others); never waits. Output: choice_index is global.
  bool next(RequestOutput& out);
  // Every prompt's stream ended and was read to its end.
  bool ended() const { return open_parts_ == 0; }
  // Blocks until there is news (or `timeout` passed), then returns; read it with next().
  // Check ended() first: the next() that found nothing may also have found the end.
  void wait_for(std::chrono::milliseconds timeout);
  // `listener` is called on the engine thread whenever there is news; it must not block.
  // Call next() after setting it: news that came before is not announced again.
  void set_listener(std::function<void()> listener);
  void cancel();

  int num_choices() const { return static_cast<int>(parts_.size()) * n_; }
  // Summed over the prompts (each prompt's tokens counted once); final once ended().
  Usage usage() const;

 private:
  struct Signal;
  struct Part {
    std::unique_ptr<RequestStream> stream;
    bool ended = false;
    bool recorded = false;
    std::vector<EngineClock::time_point> last_token_time;  // per choice, for inter-token gaps
    std::vector<double> gaps;
  };
  void record(Part& part);

  ServerState& state_;
  int n_;
  std::shared_ptr<Signal> signal_;
  std::vector<Part> parts_;
  size_t open_parts_ = 0;
  size_t next_part_ = 0;  // round-robin start
};

}  // namespace attnres::server
