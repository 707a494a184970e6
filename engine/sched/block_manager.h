// Paged KV bookkeeping: which physical cache blocks each sequence owns, and the automatic
// prefix cache over them. Pure logic, no device memory (that is KvCache). The scheduler
// decides *when* to allocate and preempt; this class answers "does it fit", allocates, and
// remembers what full blocks hold.
//
// Prefix caching (docs/PREFIX_CACHING.md), as vLLM's block pool: a block whose block_size
// tokens are all computed is registered under its contents, identified by a chain: the
// entry of the block before it (the whole prefix) plus its own token ids. A new sequence
// whose first tokens match a chain of registered blocks shares those blocks (reference
// counts) and computes only the rest. A block nobody uses any more stays registered, and
// counts as free, until its memory is needed: then the least recently freed one is evicted
// first. A block in use is never evicted. Lookups compare the chain and the tokens exactly,
// so a hash collision is a miss, never a wrong block.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

namespace attnres {

// A sequence's view of the cache: its block table and how many tokens are written.
struct SequenceBlocks {
  std::vector<int32_t> table;
  int num_tokens = 0;  // tokens whose K/V are (or, during a step, will be) in the cache
  // Prefix-cache chain: the leading blocks of `table` whose contents have been identified
  // (registered by this sequence, or found registered already), and the entry of the last.
  int num_identified_blocks = 0;
  uint64_t last_entry = 0;  // 0: the empty prefix
};

// The cached blocks a sequence's first tokens match (BlockManager::find_cached_prefix).
struct PrefixHit {
  std::vector<int32_t> blocks;
  uint64_t last_entry = 0;
  int num_tokens = 0;  // blocks.size() * block_size
};

class BlockManager {
 public:
  // Hashes (parent entry, token ids) for the cache's index; tests pass a colliding one.
  using ChainHasher = std::function<uint64_t(uint64_t parent, std::span<const int32_t> tokens)>;

  BlockManager(int num_blocks, int block_size, bool enable_prefix_caching = false,
               ChainHasher hasher = {});

  int block_size() const { return block_size_; }
  int num_blocks() const { return num_blocks_; }
  bool prefix_caching() const { return prefix_caching_; }
  // Blocks that can be handed out now: never used or released, plus cached blocks nobody
  // uses (they are evicted on demand).
  int num_free_blocks() const { return static_cast<int>(free_.size() + evictable_.size()); }
  // Blocks registered in the prefix cache (in use or not).
  int num_cached_blocks() const { return static_cast<int>(index_.size()); }
  // Blocks a sequence needs to hold num_tokens tokens.
  int blocks_for(int num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  // Can `seq` grow by new_tokens tokens with the blocks that are free now?
  bool can_append(const SequenceBlocks& seq, int new_tokens) const;
  // Grows seq's table so that num_tokens + new_tokens fit. Requires can_append.
  void append(SequenceBlocks& seq, int new_tokens);
  // Releases every block of seq: blocks nobody else uses return to the pool (registered
  // ones stay cached until evicted). Resets seq.
  void free(SequenceBlocks& seq);

  // --- prefix caching (no-ops / misses when disabled) ---
  // The longest chain of registered blocks matching the first tokens, at most max_tokens
  // tokens (whole blocks only). Takes nothing.
  PrefixHit find_cached_prefix(std::span<const int32_t> tokens, int max_tokens) const;
  // Can an empty sequence take `hit` and then grow by new_tokens?
  bool can_allocate(const PrefixHit& hit, int new_tokens) const;
  // An empty seq takes the hit's blocks (num_tokens = hit.num_tokens) and grows by
  // new_tokens. Requires can_allocate.
  void allocate(SequenceBlocks& seq, const PrefixHit& hit, int new_tokens);
  // Registers seq's blocks that are full once its first seq.num_tokens tokens (token_ids)
  // are computed. Call after the step that computed them.
  void cache_full_blocks(SequenceBlocks& seq, std::span<const int32_t> token_ids);

  int ref_count(int32_t block) const { return blocks_[block].ref_count; }

 private:
  struct Block {
    int ref_count = 0;
    uint64_t entry = 0;  // registered under this entry id; 0: not registered
    uint64_t parent = 0;
    uint64_t hash = 0;
    std::vector<int32_t> tokens;             // its contents, compared on lookup
    std::list<int32_t>::iterator evictable;  // valid when registered and ref_count == 0
  };

  int32_t take_block();  // a free block, evicting the least recently freed cached one if needed
  void unregister(int32_t block);
  // The registered block for (parent, tokens), or -1.
  int32_t lookup(uint64_t parent, std::span<const int32_t> tokens) const;
  uint64_t hash(uint64_t parent, std::span<const int32_t> tokens) const;

  int num_blocks_;
  int block_size_;
  bool prefix_caching_;
  ChainHasher hasher_;
  std::vector<Block> blocks_;
  std::vector<int32_t> free_;        // a stack of unregistered free blocks: last freed, first reused
  std::list<int32_t> evictable_;     // registered, unused: front = evicted first
  std::unordered_multimap<uint64_t, int32_t> index_;  // hash -> registered block
  uint64_t next_entry_ = 1;
};

}  // namespace attnres
