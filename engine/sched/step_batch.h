// Turns a ScheduleOutput into the forward's input (StepBatch, model_runner.h: the BatchMeta
// with token ids, positions, slot mapping and block tables, plus which rows' logits and depth
// weights to compute) and the map from those rows back to the sequences they belong to.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/core/backend.h"
#include "engine/runner/model_runner.h"
#include "engine/sched/scheduler.h"

namespace attnres {

// Logit rows a prefill chunk adds for prompt logprobs: logit rows [first_logit, first_logit +
// count) give the logprobs of prompt positions [first_position, first_position + count).
struct PromptLogprobRows {
  Sequence* seq = nullptr;
  int first_position = 0;
  int count = 0;
  size_t first_logit = 0;
};

// Depth rows a prefill chunk adds for the prompt mean of the depth-attention weights: depth
// rows [first_depth_row, first_depth_row + count) are prompt positions [first_position,
// first_position + count).
struct DepthPromptRows {
  Sequence* seq = nullptr;
  int first_position = 0;
  int count = 0;
  size_t first_depth_row = 0;
};

// One step: what the runner computes, and whose each returned row is.
struct StepPlan {
  // batch.logit_rows: first one per host sampler, then the prompt logprob rows (only for
  // sequences that ask for prompt logprobs). batch.sample_rows: one per device sampler (its
  // batch.sampling is filled later, by OutputProcessor::add_device_rows). batch.depth_rows (empty
  // unless a sequence asked): the prompt positions not yet in a sequence's mean, and the sampling
  // rows of sequences that want per-token weights (a row may appear twice: once for each purpose).
  StepBatch batch;
  std::vector<Sequence*> samplers;  // the sequence to sample for logit rows [0, samplers.size())
  std::vector<PromptLogprobRows> prompt_rows;
  std::vector<DepthPromptRows> depth_prompt_rows;
  std::vector<int32_t> sampler_depth_row;  // per sampler: its index in batch.depth_rows, or -1
  // The sequence sampled on the device at batch.sample_rows[i], and its depth row (or -1).
  std::vector<Sequence*> device_samplers;
  std::vector<int32_t> device_sampler_depth_row;
};

// Appends every chunk with add_to_batch, which advances each sequence's computed-token
// count: from here on the step is committed. on_device (may be empty: none) says which
// sequences' next token is sampled on the device.
StepPlan build_step_batch(const ScheduleOutput& schedule, int block_size,
                          const std::function<bool(const Sequence&)>& on_device = {});

}  // namespace attnres
