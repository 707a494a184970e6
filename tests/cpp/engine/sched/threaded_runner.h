// A ModelRunner that really runs each step on another thread: launch() hands the step to a
// worker and returns before it has run, collect() waits for it. It wraps any runner (the fake
// forward, or the real TransformerRunner on the CPU), so async scheduling's overlap is
// exercised here as it is on a GPU, where the device runs the step while the engine thread
// works: a race between the engine's gap work and the step (the engine touching the batch or
// the result before collect(), a sequence freed under the step) shows as wrong tokens, and
// under TSan (tests/sanitizers/run.sh tsan) as a report.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "engine/runner/model_runner.h"

namespace attnres::testing {

class ThreadedRunner : public ModelRunner {
 public:
  explicit ThreadedRunner(ModelRunner& inner) : inner_(inner), worker_([this] { work(); }) {}
  ~ThreadedRunner() override {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    worker_.join();
  }
  ThreadedRunner(const ThreadedRunner&) = delete;
  ThreadedRunner& operator=(const ThreadedRunner&) = delete;

  // Runs on the worker before each step (its index from 0), e.g. to wait until the engine
  // has done its gap work while the step is in flight.
  void set_before_step(std::function<void(int step)> hook) { before_step_ = std::move(hook); }

  int vocab_size() const override { return inner_.vocab_size(); }
  DepthAttentionLayout depth_attention_layout() const override {
    return inner_.depth_attention_layout();
  }
  bool samples_on_device() const override { return inner_.samples_on_device(); }
  bool launches_asynchronously() const override { return true; }

  void execute(const StepBatch& batch, StepResult& result) override {
    launch(batch, result);
    collect(result);
  }

  void launch(const StepBatch& batch, StepResult& result) override {
    std::lock_guard lock(mutex_);
    ASSERT_FALSE(in_flight_) << "launch() while a step is in flight";
    in_flight_ = true;
    job_ = [this, &batch, &result, step = launched_++] {
      if (before_step_) before_step_(step);
      inner_.execute(batch, result);
    };
    wake_.notify_all();
  }

  void collect(StepResult& result) override {
    (void)result;
    std::unique_lock lock(mutex_);
    ASSERT_TRUE(in_flight_) << "collect() without a launched step";
    wake_.wait(lock, [&] { return done_; });
    done_ = false;
    in_flight_ = false;
    if (std::exception_ptr error = std::exchange(error_, nullptr)) std::rethrow_exception(error);
  }

  int steps_launched() const {
    std::lock_guard lock(mutex_);
    return launched_;
  }

 private:
  void work() {
    std::unique_lock lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return quit_ || job_; });
      if (quit_) return;
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      done_ = true;
      wake_.notify_all();
    }
  }

  ModelRunner& inner_;
  std::function<void(int)> before_step_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::function<void()> job_;  // the launched step, until the worker takes it
  bool in_flight_ = false;     // launched, not yet collected
  bool done_ = false;          // the worker finished the last step; collect() not yet called
  std::exception_ptr error_;
  int launched_ = 0;
  bool quit_ = false;
  std::thread worker_;  // last: started once everything above exists
};

}  // namespace attnres::testing
