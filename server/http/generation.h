// One OpenAI request run on the engine: one EngineRequest per prompt (each with n choices),
// read as a single stream of outputs whose choice indices continue across prompts
// (prompt p, choice c -> index p * n + c, as OpenAI and vLLM number them). Records each
// engine request's metrics once its stream ends.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "engine/sched/engine_core.h"
#include "engine/sched/request_stream.h"
#include "server/common/server_state.h"

namespace attnres::server::http {

class Generation {
 public:
  // Submits every prompt. On a refusal, cancels those already accepted and throws ApiError
  // (400 InvalidRequest, 503 QueueFull / Unavailable, with Retry-After noted by the caller).
  Generation(ServerState& state, const std::string& request_id,
             const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& params, int n);
  ~Generation();  // cancels what has not ended, records metrics for what has
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // The next output of any prompt, waiting at most `timeout`. Output: choice_index is global.
  RequestStream::Poll next(std::chrono::milliseconds timeout, RequestOutput& out);
  void cancel();

  int num_choices() const { return static_cast<int>(parts_.size()) * n_; }
  // Summed over the prompts (each prompt's tokens counted once); final once next() ended.
  Usage usage() const;

 private:
  struct Part {
    std::unique_ptr<RequestStream> stream;
    bool ended = false;
    bool recorded = false;
    std::vector<EngineClock::time_point> last_time;  // per choice, for inter-token gaps
    std::vector<double> gaps;
  };
  RequestStream::Poll poll_part(size_t i, std::chrono::milliseconds timeout, RequestOutput& out);
  void record(Part& part);

  ServerState& state_;
  int n_;
  std::vector<Part> parts_;
  size_t next_part_ = 0;  // round-robin start, so no prompt starves the others
};

}  // namespace attnres::server::http
