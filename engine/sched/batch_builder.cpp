#include "engine/sched/batch_builder.h"

#include "engine/core/error.h"

namespace attnres {

int32_t add_to_batch(BatchMeta& batch, SequenceBlocks& seq, std::span<const int32_t> tokens,
                     int block_size) {
  ATTNRES_CHECK(!tokens.empty(), "a sequence with no new tokens in a step");
  const int first = seq.num_tokens;
  const int last = first + static_cast<int>(tokens.size());
  ATTNRES_CHECK(static_cast<int>(seq.table.size()) * block_size >= last,
                "block table too short for the step");
  if (batch.query_start.empty()) batch.query_start.push_back(0);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int pos = first + static_cast<int>(i);
    batch.token_ids.push_back(tokens[i]);
    batch.positions.push_back(pos);
    batch.slot_mapping.push_back(seq.table[pos / block_size] * block_size + pos % block_size);
  }
  batch.num_tokens += static_cast<int>(tokens.size());
  batch.query_start.push_back(batch.num_tokens);
  batch.context_len.push_back(last);
  batch.block_tables.push_back(seq.table);
  seq.num_tokens = last;
  return batch.num_tokens - 1;
}

}  // namespace attnres
