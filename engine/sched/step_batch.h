// Turns a ScheduleOutput into the forward's input: the BatchMeta (token ids, positions, slot
// mapping, block tables) plus which rows' logits to compute and whose they are.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/backend.h"
#include "engine/sched/scheduler.h"

namespace attnres {

struct StepBatch {
  BatchMeta meta;
  std::vector<int32_t> logit_rows;  // rows of meta whose next-token logits are needed
  std::vector<Sequence*> samplers;  // the sequence to sample for each logit row
};

// Appends every chunk with add_to_batch, which advances each sequence's computed-token
// count: from here on the step is committed.
StepBatch build_step_batch(const ScheduleOutput& schedule, int block_size);

}  // namespace attnres
