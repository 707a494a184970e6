#include "engine/sched/block_manager.h"

#include <algorithm>

#include "engine/core/error.h"

namespace attnres {
namespace {

// FNV-1a over the parent entry and the token ids: the index's bucket only (lookups compare
// the parent and the tokens themselves).
uint64_t fnv1a(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(parent);
  for (int32_t t : tokens) mix(static_cast<uint32_t>(t));
  return h;
}

}  // namespace

BlockManager::BlockManager(int num_blocks, int block_size, bool enable_prefix_caching,
                           ChainHasher hasher)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      prefix_caching_(enable_prefix_caching),
      hasher_(std::move(hasher)) {
  ATTNRES_CHECK(num_blocks > 0 && block_size > 0, "block manager needs blocks");
  blocks_.resize(static_cast<size_t>(num_blocks));
  free_.reserve(num_blocks);
  for (int i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
}

uint64_t BlockManager::hash(uint64_t parent, std::span<const int32_t> tokens) const {
  return hasher_ ? hasher_(parent, tokens) : fnv1a(parent, tokens);
}

bool BlockManager::can_append(const SequenceBlocks& seq, int new_tokens) const {
  const int needed = blocks_for(seq.num_tokens + new_tokens) - static_cast<int>(seq.table.size());
  return needed <= num_free_blocks();
}

int32_t BlockManager::take_block() {
  int32_t block;
  if (!free_.empty()) {
    block = free_.back();
    free_.pop_back();
  } else {
    ATTNRES_CHECK(!evictable_.empty(), "no free block to take");
    block = evictable_.front();
    evictable_.pop_front();
    unregister(block);
  }
  blocks_[block].ref_count = 1;
  return block;
}

void BlockManager::append(SequenceBlocks& seq, int new_tokens) {
  ATTNRES_CHECK(can_append(seq, new_tokens), "append without free blocks");
  const int needed = blocks_for(seq.num_tokens + new_tokens);
  while (static_cast<int>(seq.table.size()) < needed) seq.table.push_back(take_block());
}

void BlockManager::free(SequenceBlocks& seq) {
  // The tail first: a sequence's last blocks are the least likely to be shared, so they go
  // to the front of the eviction order.
  for (auto it = seq.table.rbegin(); it != seq.table.rend(); ++it) {
    Block& b = blocks_[*it];
    ATTNRES_CHECK(b.ref_count > 0, "freeing a block nobody holds");
    if (--b.ref_count > 0) continue;
    if (b.entry != 0) {
      b.evictable = evictable_.insert(evictable_.end(), *it);
    } else {
      free_.push_back(*it);
    }
  }
  seq = SequenceBlocks{};
}

void BlockManager::unregister(int32_t block) {
  Block& b = blocks_[block];
  auto [first, last] = index_.equal_range(b.hash);
  for (auto it = first; it != last; ++it) {
    if (it->second == block) {
      index_.erase(it);
      break;
    }
  }
  b.entry = 0;
  b.tokens.clear();
}

int32_t BlockManager::lookup(uint64_t parent, std::span<const int32_t> tokens) const {
  auto [first, last] = index_.equal_range(hash(parent, tokens));
  for (auto it = first; it != last; ++it) {
    const Block& b = blocks_[it->second];
    if (b.parent == parent && std::equal(tokens.begin(), tokens.end(), b.tokens.begin(),
                                         b.tokens.end())) {
      return it->second;
    }
  }
  return -1;
}

PrefixHit BlockManager::find_cached_prefix(std::span<const int32_t> tokens, int max_tokens) const {
  PrefixHit hit;
  if (!prefix_caching_) return hit;
  const int max_blocks = std::min(static_cast<int>(tokens.size()), max_tokens) / block_size_;
  for (int i = 0; i < max_blocks; ++i) {
    const int32_t block =
        lookup(hit.last_entry, tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_));
    if (block < 0) break;
    hit.blocks.push_back(block);
    hit.last_entry = blocks_[block].entry;
  }
  hit.num_tokens = static_cast<int>(hit.blocks.size()) * block_size_;
  return hit;
}

bool BlockManager::can_allocate(const PrefixHit& hit, int new_tokens) const {
  // Hit blocks nobody uses are counted as free now; taking them makes them busy.
  int hit_evictable = 0;
  for (int32_t b : hit.blocks) hit_evictable += blocks_[b].ref_count == 0 ? 1 : 0;
  const int needed = blocks_for(hit.num_tokens + new_tokens) - static_cast<int>(hit.blocks.size());
  return needed <= num_free_blocks() - hit_evictable;
}

void BlockManager::allocate(SequenceBlocks& seq, const PrefixHit& hit, int new_tokens) {
  ATTNRES_CHECK(seq.table.empty() && seq.num_tokens == 0, "allocate on a sequence with blocks");
  ATTNRES_CHECK(can_allocate(hit, new_tokens), "allocate without free blocks");
  for (int32_t block : hit.blocks) {
    Block& b = blocks_[block];
    if (b.ref_count++ == 0) evictable_.erase(b.evictable);
    seq.table.push_back(block);
  }
  seq.num_tokens = hit.num_tokens;
  seq.num_identified_blocks = static_cast<int>(hit.blocks.size());
  seq.last_entry = hit.last_entry;
  append(seq, new_tokens);
}

void BlockManager::cache_full_blocks(SequenceBlocks& seq, std::span<const int32_t> token_ids) {
  if (!prefix_caching_) return;
  const int full = std::min(seq.num_tokens, static_cast<int>(token_ids.size())) / block_size_;
  for (int i = seq.num_identified_blocks; i < full; ++i) {
    const auto tokens = token_ids.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const int32_t existing = lookup(seq.last_entry, tokens);
    if (existing >= 0) {
      // Another sequence computed the same block first (both ran in one step): the chain
      // continues through its entry, and this copy stays private.
      seq.last_entry = blocks_[existing].entry;
    } else {
      Block& b = blocks_[seq.table[i]];
      ATTNRES_CHECK(b.entry == 0, "registering a block twice");
      b.entry = next_entry_++;
      b.parent = seq.last_entry;
      b.hash = hash(b.parent, tokens);
      b.tokens.assign(tokens.begin(), tokens.end());
      index_.emplace(b.hash, seq.table[i]);
      seq.last_entry = b.entry;
    }
    seq.num_identified_blocks = i + 1;
  }
}

}  // namespace attnres
