#include "engine/sched/step_batch.h"

#include <span>

#include "engine/sched/batch_builder.h"

namespace attnres {

StepBatch build_step_batch(const ScheduleOutput& schedule, int block_size) {
  StepBatch step;
  for (const ScheduledChunk& chunk : schedule.chunks) {
    Sequence& seq = *chunk.seq;
    const auto tokens = std::span(seq.token_ids)
                            .subspan(static_cast<size_t>(seq.num_computed_tokens()),
                                     static_cast<size_t>(chunk.num_new_tokens));
    const int32_t row = add_to_batch(step.meta, seq.blocks, tokens, block_size);
    if (chunk.produces_logits) {
      step.logit_rows.push_back(row);
      step.samplers.push_back(&seq);
    }
  }
  return step;
}

}  // namespace attnres
