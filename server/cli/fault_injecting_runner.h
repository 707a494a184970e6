// A ModelRunner that passes every step to another one and makes the forward fail from a
// given step on: how the end-to-end tests check what a failed forward does to the server
// (the engine dies, /health answers 503, `attnres serve` exits 1). Enabled only by the
// ATTNRES_TEST_FAIL_FORWARD_AFTER environment variable (a number of steps), which no user sets.
#pragma once

#include <cstdlib>
#include <memory>

#include "engine/core/error.h"
#include "engine/runner/model_runner.h"

namespace attnres::cli {

class FaultInjectingRunner : public ModelRunner {
 public:
  FaultInjectingRunner(std::unique_ptr<ModelRunner> inner, long steps_before_failure)
      : inner_(std::move(inner)), steps_left_(steps_before_failure) {}

  // The runner to use: `inner` itself, unless ATTNRES_TEST_FAIL_FORWARD_AFTER is set.
  static std::unique_ptr<ModelRunner> wrap_if_requested(std::unique_ptr<ModelRunner> inner);

  int vocab_size() const override { return inner_->vocab_size(); }
  DepthAttentionLayout depth_attention_layout() const override {
    return inner_->depth_attention_layout();
  }
  bool samples_on_device() const override { return inner_->samples_on_device(); }
  void execute(const StepBatch& batch, StepResult& result) override {
    count_step();
    inner_->execute(batch, result);
  }

 private:
  void count_step() {
    if (steps_left_-- <= 0) throw Error("injected forward failure (ATTNRES_TEST_FAIL_FORWARD_AFTER)");
  }

  std::unique_ptr<ModelRunner> inner_;
  long steps_left_;
};

inline std::unique_ptr<ModelRunner> FaultInjectingRunner::wrap_if_requested(
    std::unique_ptr<ModelRunner> inner) {
  const char* steps = std::getenv("ATTNRES_TEST_FAIL_FORWARD_AFTER");
  if (!steps || !*steps) return inner;
  return std::make_unique<FaultInjectingRunner>(std::move(inner), std::atol(steps));
}

}  // namespace attnres::cli
