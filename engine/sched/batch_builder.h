// Builds a step's BatchMeta from sequences: each contributes a run of new tokens (a
// prefill chunk or one decode token) whose positions continue its cached prefix and
// whose K/V slots come from its block table.
#pragma once

#include <span>

#include "engine/core/backend.h"
#include "engine/sched/block_manager.h"

namespace attnres {

// Appends `tokens` of `seq` to `batch` and advances seq.num_tokens. The block table must
// already cover the new tokens (BlockManager::append). Returns the row of the sequence's
// last token in the step (where its next-token logits come from).
int32_t add_to_batch(BatchMeta& batch, SequenceBlocks& seq, std::span<const int32_t> tokens,
                     int block_size);

}  // namespace attnres
