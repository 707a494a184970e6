// Ctrl-C for attnres-client: SIGINT and SIGTERM cancel the running call instead of killing
// the process mid-stream.
//
// Why a thread and not a signal handler: cancelling a gRPC call (ClientContext::TryCancel)
// takes locks and is not async-signal-safe. So the signals are blocked in every thread (the
// InterruptWatcher must be made before any other thread starts, gRPC's included: threads
// inherit the mask) and one watcher thread takes them with sigwait and runs ordinary code.
// The first signal runs the current action (cancel the call; the command then exits with
// 128 + signal); with no action set, or at a second signal, the process exits at once.
#pragma once

#include <functional>
#include <memory>

namespace attnres::client::cli {

class InterruptWatcher {
 public:
  InterruptWatcher();
  // The watcher thread lives to the end of the process (it owns a share of the state).
  ~InterruptWatcher() = default;

  // The signal received (SIGINT, SIGTERM), or 0.
  int signal_received() const;

  // Runs `action` on the next signal while the returned guard lives. The guard's destructor
  // waits for an action already running, so the action may use objects that outlive the guard.
  class Guard {
   public:
    Guard(Guard&&) = delete;
    ~Guard();

   private:
    friend class InterruptWatcher;
    explicit Guard(InterruptWatcher& watcher) : watcher_(watcher) {}
    InterruptWatcher& watcher_;
  };
  [[nodiscard]] std::unique_ptr<Guard> on_interrupt(std::function<void()> action);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

}  // namespace attnres::client::cli
