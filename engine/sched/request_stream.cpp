#include "engine/sched/request_stream.h"

#include <utility>

namespace attnres {

void StreamChannel::push(RequestOutput output) {
  {
    std::lock_guard lock(mutex_);
    outputs_.push_back(std::move(output));
  }
  notify();
}

void StreamChannel::notify() {
  ready_.notify_all();
  if (listener_) listener_();
}

void StreamChannel::close(const Usage& usage, const RequestTimings& timings) {
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    usage_ = usage;
    timings_ = timings;
  }
  notify();
}

StreamChannel::Poll StreamChannel::next_until(std::optional<EngineClock::time_point> deadline,
                                              RequestOutput& out) {
  std::unique_lock lock(mutex_);
  auto has_news = [this] { return !outputs_.empty() || closed_; };
  if (deadline) {
    if (!ready_.wait_until(lock, *deadline, has_news)) return Poll::Timeout;
  } else {
    ready_.wait(lock, has_news);
  }
  if (outputs_.empty()) return Poll::Ended;
  out = std::move(outputs_.front());
  outputs_.pop_front();
  return Poll::Output;
}

StreamChannel::Poll StreamChannel::try_next(RequestOutput& out) {
  std::lock_guard lock(mutex_);
  if (outputs_.empty()) return closed_ ? Poll::Ended : Poll::Timeout;
  out = std::move(outputs_.front());
  outputs_.pop_front();
  return Poll::Output;
}

bool StreamChannel::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

Usage StreamChannel::usage() const {
  std::lock_guard lock(mutex_);
  return usage_;
}

RequestTimings StreamChannel::timings() const {
  std::lock_guard lock(mutex_);
  return timings_;
}

RequestStream::RequestStream(std::string request_id, std::shared_ptr<StreamChannel> channel,
                             std::function<void(const std::string&)> abort)
    : request_id_(std::move(request_id)), channel_(std::move(channel)), abort_(std::move(abort)) {}

RequestStream::~RequestStream() {
  if (!channel_->closed()) cancel();
}

std::optional<RequestOutput> RequestStream::next() {
  RequestOutput out;
  if (channel_->next_until(std::nullopt, out) == Poll::Ended) return std::nullopt;
  return out;
}

RequestStream::Poll RequestStream::next_for(std::chrono::milliseconds timeout, RequestOutput& out) {
  return channel_->next_until(EngineClock::now() + timeout, out);
}

void RequestStream::cancel() {
  if (abort_) abort_(request_id_);
}

}  // namespace attnres
