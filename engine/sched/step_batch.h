// Turns a ScheduleOutput into the forward's input: the BatchMeta (token ids, positions, slot
// mapping, block tables) plus which rows' logits to compute and whose they are.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/backend.h"
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

struct StepBatch {
  BatchMeta meta;
  // Rows of meta whose next-token logits are needed: first one per sampler, then the prompt
  // logprob rows (only for sequences that ask for prompt logprobs).
  std::vector<int32_t> logit_rows;
  std::vector<Sequence*> samplers;  // the sequence to sample for logit rows [0, samplers.size())
  std::vector<PromptLogprobRows> prompt_rows;
  // Rows of meta whose depth-mix weights are needed (empty unless a sequence asked): the
  // prompt positions not yet in a sequence's mean, and the sampling rows of sequences that
  // want per-token weights (a row may appear twice: once for each purpose).
  std::vector<int32_t> depth_rows;
  std::vector<DepthPromptRows> depth_prompt_rows;
  std::vector<int32_t> sampler_depth_row;  // per sampler: its index in depth_rows, or -1
};

// Appends every chunk with add_to_batch, which advances each sequence's computed-token
// count: from here on the step is committed.
StepBatch build_step_batch(const ScheduleOutput& schedule, int block_size);

}  // namespace attnres
