// Drives a Scheduler step by step with FakeRunner and greedy argmax, the way EngineCore does
// but without threads, so tests can assert the exact per-step timeline. A step is described
// as "A:2* B:8 | preempted C": sequence A computes 2 tokens and yields logits (*), B computes
// an 8-token prefill chunk, C was preempted while scheduling this step.
#pragma once

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/sched/scheduler.h"
#include "engine/sched/step_batch.h"
#include "fake_model.h"

namespace attnres::testing {

class SchedulerHarness {
 public:
  SchedulerHarness(const SchedulerConfig& config, int num_blocks, int block_size)
      : scheduler(config, BlockManager(num_blocks, block_size)),
        runner(num_blocks, block_size),
        block_size_(block_size) {}

  // arrival_order defaults to the order of add() calls (what the engine does); a test may
  // pass an earlier one to model a request that arrived before the running ones.
  Sequence* add(const std::string& id, const std::vector<int32_t>& prompt, int max_tokens,
                std::optional<uint64_t> arrival_order = std::nullopt) {
    SamplingParams params;
    params.max_tokens = max_tokens;
    const uint64_t order = arrival_order ? *arrival_order : next_order_++;
    sequences.push_back(
        std::make_unique<Sequence>(id, 0, prompt, params, order, EngineClock::now()));
    scheduler.add(sequences.back().get());
    return sequences.back().get();
  }

  Sequence& get(const std::string& id) {
    for (auto& seq : sequences) {
      if (seq->request_id == id) return *seq;
    }
    throw std::runtime_error("no sequence " + id);
  }

  std::string step() {
    ScheduleOutput out = scheduler.schedule();
    std::string description;
    for (const ScheduledChunk& chunk : out.chunks) {
      if (!description.empty()) description += " ";
      description += chunk.seq->request_id + ":" + std::to_string(chunk.num_new_tokens) +
                     (chunk.produces_logits ? "*" : "");
    }
    for (Sequence* seq : out.preempted) description += " | preempted " + seq->request_id;
    for (Sequence* seq : out.failed) description += " | failed " + seq->request_id;
    if (out.empty()) return description;
    StepPlan plan = build_step_batch(out, block_size_);
    StepResult result;
    runner.execute(plan.batch, result);
    const std::vector<float>& logits = result.logits;
    for (size_t i = 0; i < plan.samplers.size(); ++i) {
      Sequence* seq = plan.samplers[i];
      auto row = logits.begin() + static_cast<std::ptrdiff_t>(i * kVocab);
      seq->append_token(static_cast<int32_t>(std::max_element(row, row + kVocab) - row));
      if (seq->num_output_tokens() >= seq->params.max_tokens) {
        scheduler.finish(seq, FinishReason::Length);
      }
    }
    return description;
  }

  // Steps until nothing is left; returns each step's description.
  std::vector<std::string> run(int max_steps = 1000) {
    std::vector<std::string> timeline;
    while (scheduler.has_unfinished() && max_steps-- > 0) timeline.push_back(step());
    return timeline;
  }

  std::vector<int32_t> output(const std::string& id) {
    auto ids = get(id).output_ids();
    return {ids.begin(), ids.end()};
  }

  Scheduler scheduler;
  FakeRunner runner;
  std::vector<std::unique_ptr<Sequence>> sequences;

 private:
  int block_size_;
  uint64_t next_order_ = 100;
};

}  // namespace attnres::testing
