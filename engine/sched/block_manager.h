// Paged KV bookkeeping: which physical cache blocks each sequence owns. Pure logic, no
// device memory (that is KvCache). The server's scheduler decides *when* to allocate and
// preempt; this class only answers "does it fit" and does the allocation.
#pragma once

#include <cstdint>
#include <vector>

namespace attnres {

// A sequence's view of the cache: its block table and how many tokens are written.
struct SequenceBlocks {
  std::vector<int32_t> table;
  int num_tokens = 0;  // tokens whose K/V are (or, during a step, will be) in the cache
};

class BlockManager {
 public:
  BlockManager(int num_blocks, int block_size);

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  int num_free_blocks() const { return static_cast<int>(free_.size()); }
  // Blocks a sequence needs to hold num_tokens tokens.
  int blocks_for(int num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  // Can `seq` grow by new_tokens tokens with the blocks that are free now?
  bool can_append(const SequenceBlocks& seq, int new_tokens) const;
  // Grows seq's table so that num_tokens + new_tokens fit. Requires can_append.
  void append(SequenceBlocks& seq, int new_tokens);
  // Returns every block of seq to the pool.
  void free(SequenceBlocks& seq);

 private:
  int num_blocks_;
  int block_size_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
};

}  // namespace attnres
