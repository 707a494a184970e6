#include "server/http/generation.h"

#include "server/http/api_error.h"

namespace attnres::server::http {

Generation::Generation(ServerState& state, const std::string& request_id,
                       const std::vector<std::vector<int32_t>>& prompts,
                       const SamplingParams& params, int n)
    : state_(state), n_(n) {
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
    SubmitResult result = state.engine().submit(std::move(request));
    switch (result.status) {
      case SubmitStatus::Accepted:
        break;
      case SubmitStatus::InvalidRequest:
        cancel();
        throw bad_request(result.message, field_named_in(result.message));
      case SubmitStatus::QueueFull:
        cancel();
        throw ApiError(503, "the server is busy (request queue full): " + result.message, "",
                       "queue_full");
      case SubmitStatus::Unavailable:
        cancel();
        throw ApiError(503, "the server is not accepting requests: " + result.message, "",
                       "unavailable");
    }
    Part part;
    part.stream = std::move(result.stream);
    part.last_time.resize(static_cast<size_t>(n));
    parts_.push_back(std::move(part));
  }
}

Generation::~Generation() {
  for (Part& part : parts_) {
    if (!part.stream->ended()) part.stream->cancel();
    if (part.stream->ended()) record(part);
  }
}

void Generation::cancel() {
  for (Part& part : parts_) part.stream->cancel();
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

RequestStream::Poll Generation::poll_part(size_t i, std::chrono::milliseconds timeout,
                                          RequestOutput& out) {
  Part& part = parts_[i];
  const RequestStream::Poll poll = part.stream->next_for(timeout, out);
  if (poll == RequestStream::Poll::Ended) {
    part.ended = true;
    record(part);
  } else if (poll == RequestStream::Poll::Output) {
    auto& last = part.last_time[static_cast<size_t>(out.choice_index)];
    if (last != EngineClock::time_point{}) {
      part.gaps.push_back(std::chrono::duration<double>(out.time - last).count());
    }
    last = out.time;
    out.choice_index += static_cast<int>(i) * n_;
  }
  return poll;
}

RequestStream::Poll Generation::next(std::chrono::milliseconds timeout, RequestOutput& out) {
  if (parts_.size() == 1) {
    if (parts_[0].ended) return RequestStream::Poll::Ended;
    return poll_part(0, timeout, out);
  }
  // Several prompts: take whatever is ready, round robin; else wait a little on one of them.
  size_t open = 0;
  for (size_t k = 0; k < parts_.size(); ++k) {
    const size_t i = (next_part_ + k) % parts_.size();
    if (parts_[i].ended) continue;
    if (poll_part(i, std::chrono::milliseconds(0), out) == RequestStream::Poll::Output) {
      next_part_ = (i + 1) % parts_.size();
      return RequestStream::Poll::Output;
    }
    if (!parts_[i].ended) ++open;
  }
  if (open == 0) return RequestStream::Poll::Ended;
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (parts_[i].ended) continue;
    const auto wait = std::min(timeout, std::chrono::milliseconds(5));
    const RequestStream::Poll poll = poll_part(i, wait, out);
    return poll == RequestStream::Poll::Output ? poll : RequestStream::Poll::Timeout;
  }
  return RequestStream::Poll::Ended;
}

}  // namespace attnres::server::http
