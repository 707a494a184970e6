#include "server/common/generation.h"

#include <condition_variable>
#include <mutex>

#include "server/common/request_error.h"

namespace attnres::server {

// The per-request event every prompt's stream raises (from the engine thread).
struct Generation::Signal {
  std::mutex mutex;
  std::condition_variable raised_cv;
  bool raised = false;
  // Shared, so that a raise (once per engine output, on the engine thread) copies a pointer,
  // not the function.
  std::shared_ptr<const std::function<void()>> listener;

  void raise() {
    std::shared_ptr<const std::function<void()>> call;
    {
      std::lock_guard lock(mutex);
      raised = true;
      call = listener;
    }
    raised_cv.notify_all();
    if (call) (*call)();
  }
};

Generation::Generation(ServerState& state, const std::string& request_id,
                       const std::vector<std::vector<int32_t>>& prompts,
                       const SamplingParams& params, int n)
    : state_(state), n_(n), signal_(std::make_shared<Signal>()) {
  if (!state.accepting()) {
    throw RequestError(Refusal::Unavailable,
                       "the server is shutting down and accepts no new requests");
  }
  parts_.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EngineRequest request;
    request.request_id = request_id;
    if (prompts.size() > 1) {  // engine ids must be unique among unfinished requests
      request.request_id += '-';
      request.request_id += std::to_string(i);
    }
    request.prompt_ids = prompts[i];
    request.params = params;
    request.n = n;
    request.listener = [signal = signal_] { signal->raise(); };
    SubmitResult result = state.engine().submit(std::move(request));
    switch (result.status) {
      case SubmitStatus::Accepted:
        break;
      case SubmitStatus::InvalidRequest:
        cancel();
        throw RequestError(Refusal::InvalidArgument, result.message,
                           field_named_in(result.message));
      case SubmitStatus::QueueFull:
        cancel();
        throw RequestError(Refusal::QueueFull,
                           "the server is busy (request queue full): " + result.message);
      case SubmitStatus::Unavailable:
        cancel();
        throw RequestError(Refusal::Unavailable,
                           "the server is not accepting requests: " + result.message);
    }
    Part part;
    part.stream = std::move(result.stream);
    part.last_token_time.resize(static_cast<size_t>(n));
    parts_.push_back(std::move(part));
  }
  open_parts_ = parts_.size();
}

Generation::~Generation() {
  set_listener({});
  for (Part& part : parts_) {
    if (!part.stream->ended()) part.stream->cancel();
    if (part.stream->ended()) record(part);
  }
}

void Generation::cancel() {
  for (Part& part : parts_) part.stream->cancel();
}

void Generation::set_listener(std::function<void()> listener) {
  std::lock_guard lock(signal_->mutex);
  signal_->listener =
      listener ? std::make_shared<const std::function<void()>>(std::move(listener)) : nullptr;
}

void Generation::wait_for(std::chrono::milliseconds timeout) {
  std::unique_lock lock(signal_->mutex);
  signal_->raised_cv.wait_for(lock, timeout, [this] { return signal_->raised; });
  signal_->raised = false;
}

Usage Generation::usage() const {
  Usage total;
  for (const Part& part : parts_) {
    const Usage u = part.stream->usage();
    total.prompt_tokens += u.prompt_tokens;
    total.completion_tokens += u.completion_tokens;
    total.cached_tokens += u.cached_tokens;
  }
  return total;
}

void Generation::record(Part& part) {
  if (part.recorded) return;
  part.recorded = true;
  state_.metrics().record_request(part.stream->timings(), part.stream->usage(), part.gaps);
}

bool Generation::next(RequestOutput& out) {
  for (size_t k = 0; k < parts_.size(); ++k) {
    const size_t i = (next_part_ + k) % parts_.size();
    Part& part = parts_[i];
    if (part.ended) continue;
    switch (part.stream->try_next(out)) {
      case RequestStream::Poll::Timeout:
        continue;
      case RequestStream::Poll::Ended:
        part.ended = true;
        --open_parts_;
        record(part);
        continue;
      case RequestStream::Poll::Output:
        break;
    }
    // Inter-token latency as the client sees it: the gap between consecutive outputs of a
    // choice that carry tokens.
    if (!out.token_ids.empty()) {
      auto& last = part.last_token_time[static_cast<size_t>(out.choice_index)];
      if (last != EngineClock::time_point{}) {
        part.gaps.push_back(std::chrono::duration<double>(out.time - last).count());
      }
      last = out.time;
    }
    out.choice_index += static_cast<int>(i) * n_;
    next_part_ = (i + 1) % parts_.size();
    return true;
  }
  return false;
}

}  // namespace attnres::server
