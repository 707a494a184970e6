#include "clients/cpp/cli/interrupt.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <system_error>
#include <thread>

namespace attnres::client::cli {

struct InterruptWatcher::State {
  std::mutex mutex;  // held while the action is set, cleared or run
  std::function<void()> action;
  std::atomic<int> signal{0};
};

namespace {

sigset_t watched_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

void watch(const std::shared_ptr<InterruptWatcher::State>& state, sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (state->signal.exchange(sig) != 0) std::_Exit(128 + sig);  // the second one: give up
    std::lock_guard lock(state->mutex);
    if (!state->action) std::_Exit(128 + sig);  // nothing to cancel: end like the default
    state->action();
  }
}

}  // namespace

InterruptWatcher::InterruptWatcher() : state_(std::make_shared<State>()) {
  const sigset_t set = watched_signals();
  if (const int error = pthread_sigmask(SIG_BLOCK, &set, nullptr); error != 0) {
    throw std::system_error(error, std::generic_category(), "pthread_sigmask");
  }
  std::thread(watch, state_, set).detach();
}

int InterruptWatcher::signal_received() const { return state_->signal.load(); }

std::unique_ptr<InterruptWatcher::Guard> InterruptWatcher::on_interrupt(
    std::function<void()> action) {
  std::lock_guard lock(state_->mutex);
  state_->action = std::move(action);
  return std::unique_ptr<Guard>(new Guard(*this));
}

InterruptWatcher::Guard::~Guard() {
  std::lock_guard lock(watcher_.state_->mutex);
  watcher_.state_->action = nullptr;
}

}  // namespace attnres::client::cli
