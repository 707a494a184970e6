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

struct StepBatch {
  BatchMeta meta;
  // Rows of meta whose next-token logits are needed: first one per sampler, then the prompt
  // logprob rows (only for sequences that ask for prompt logprobs).
  std::vector<int32_t> logit_rows;
  std::vector<Sequence*> samplers;  // the sequence to sample for logit rows [0, samplers.size())
  std::vector<PromptLogprobRows> prompt_rows;
};

// Appends every chunk with add_to_batch, which advances each sequence's computed-token
// count: from here on the step is committed.
StepBatch build_step_batch(const ScheduleOutput& schedule, int block_size);

}  // namespace attnres
