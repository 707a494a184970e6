#include "engine/sched/block_manager.h"

#include "engine/core/error.h"

namespace attnres {

BlockManager::BlockManager(int num_blocks, int block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  ATTNRES_CHECK(num_blocks > 0 && block_size > 0, "block manager needs blocks");
  free_.reserve(num_blocks);
  for (int i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
}

bool BlockManager::can_append(const SequenceBlocks& seq, int new_tokens) const {
  const int needed = blocks_for(seq.num_tokens + new_tokens) - static_cast<int>(seq.table.size());
  return needed <= num_free_blocks();
}

void BlockManager::append(SequenceBlocks& seq, int new_tokens) {
  ATTNRES_CHECK(can_append(seq, new_tokens), "append without free blocks");
  const int needed = blocks_for(seq.num_tokens + new_tokens);
  while (static_cast<int>(seq.table.size()) < needed) {
    seq.table.push_back(free_.back());
    free_.pop_back();
  }
}

void BlockManager::free(SequenceBlocks& seq) {
  for (auto it = seq.table.rbegin(); it != seq.table.rend(); ++it) free_.push_back(*it);
  seq.table.clear();
  seq.num_tokens = 0;
}

}  // namespace attnres
