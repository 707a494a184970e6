// The prefix cache of BlockManager, as written timelines: block size 4, so a 10-token
// sequence fills blocks 0-1 and starts a third. Each test states who holds which block and
// what the cache remembers after every step.
#include <gtest/gtest.h>

#include <numeric>
#include <set>
#include <vector>

#include "engine/sched/block_manager.h"

namespace attnres {
namespace {

constexpr int kBlock = 4;

std::vector<int32_t> tokens(int n, int32_t first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

// A sequence as the scheduler drives one: look up, take, compute (num_tokens), register.
SequenceBlocks run(BlockManager& blocks, const std::vector<int32_t>& ids, int* hit_tokens = nullptr) {
  SequenceBlocks seq;
  const PrefixHit hit = blocks.find_cached_prefix(ids, static_cast<int>(ids.size()) - 1);
  const int new_tokens = static_cast<int>(ids.size()) - hit.num_tokens;
  EXPECT_TRUE(blocks.can_allocate(hit, new_tokens));
  blocks.allocate(seq, hit, new_tokens);
  seq.num_tokens = static_cast<int>(ids.size());
  blocks.cache_full_blocks(seq, ids);
  if (hit_tokens) *hit_tokens = hit.num_tokens;
  return seq;
}

TEST(PrefixCache, AFullHitSharesTheBlocksAndComputesOnlyTheTail) {
  BlockManager blocks(8, kBlock, /*enable_prefix_caching=*/true);
  const std::vector<int32_t> prompt = tokens(10, 100);
  int hit = -1;
  SequenceBlocks a = run(blocks, prompt, &hit);
  EXPECT_EQ(hit, 0);                         // a cold cache
  EXPECT_EQ(blocks.num_cached_blocks(), 2);  // blocks 0-1 full, the third is not
  SequenceBlocks b = run(blocks, prompt, &hit);
  EXPECT_EQ(hit, 8);  // two blocks shared; tokens 8-9 computed into b's own block
  EXPECT_EQ(b.table[0], a.table[0]);
  EXPECT_EQ(b.table[1], a.table[1]);
  EXPECT_NE(b.table[2], a.table[2]);
  EXPECT_EQ(blocks.ref_count(a.table[0]), 2);
  EXPECT_EQ(blocks.num_free_blocks(), 8 - 4);
}

TEST(PrefixCache, ThePromptsLastTokenIsNeverAHit) {
  BlockManager blocks(8, kBlock, true);
  const std::vector<int32_t> prompt = tokens(8, 0);  // exactly two blocks
  SequenceBlocks a = run(blocks, prompt);
  EXPECT_EQ(blocks.num_cached_blocks(), 2);
  // At most 7 tokens may come from the cache: the 8th must be computed for its logits, so
  // only the first block is a hit.
  EXPECT_EQ(blocks.find_cached_prefix(prompt, 7).num_tokens, 4);
}

TEST(PrefixCache, APartialHitStopsAtTheFirstDifferentBlock) {
  BlockManager blocks(8, kBlock, true);
  std::vector<int32_t> first = tokens(12, 0);
  run(blocks, first);
  std::vector<int32_t> second = first;
  second[5] = 999;  // block 1 differs
  EXPECT_EQ(blocks.find_cached_prefix(second, 11).num_tokens, 4);
  // The same block 2 after a different block 1 is a different prefix: no hit past block 0.
  second[5] = first[5];
  second[1] = 999;
  EXPECT_EQ(blocks.find_cached_prefix(second, 11).num_tokens, 0);
}

TEST(PrefixCache, FreedBlocksStayCachedAndAreEvictedLeastRecentlyFreedFirst) {
  BlockManager blocks(4, kBlock, true);
  SequenceBlocks a = run(blocks, tokens(8, 0));     // blocks: a0 a1 (both full, cached)
  SequenceBlocks b = run(blocks, tokens(8, 100));   // b0 b1
  blocks.free(a);                                   // t1: a's blocks unused, still cached
  blocks.free(b);                                   // t2: then b's
  EXPECT_EQ(blocks.num_free_blocks(), 4);           // cached-but-unused counts as free
  EXPECT_EQ(blocks.num_cached_blocks(), 4);
  // Two new blocks evict the least recently freed: a's, the tail (a1) before the head (a0).
  SequenceBlocks c;
  blocks.append(c, 4);
  EXPECT_EQ(blocks.num_cached_blocks(), 3);
  EXPECT_EQ(blocks.find_cached_prefix(tokens(8, 0), 8).num_tokens, 4);  // a0 left, a1 gone
  blocks.append(c, 8);  // a second block for c: a0 goes too
  EXPECT_EQ(blocks.find_cached_prefix(tokens(8, 0), 8).num_tokens, 0);
  EXPECT_EQ(blocks.find_cached_prefix(tokens(8, 100), 8).num_tokens, 8);  // b untouched
}

TEST(PrefixCache, ABlockInUseIsNeverEvicted) {
  BlockManager blocks(3, kBlock, true);
  SequenceBlocks a = run(blocks, tokens(8, 0));  // a0 a1 cached and held
  SequenceBlocks b;
  EXPECT_TRUE(blocks.can_append(b, 4));
  EXPECT_FALSE(blocks.can_append(b, 5));  // one free block only: a's are in use
  blocks.append(b, 4);
  EXPECT_EQ(blocks.num_free_blocks(), 0);
  EXPECT_EQ(blocks.find_cached_prefix(tokens(8, 0), 8).num_tokens, 8);
  EXPECT_EQ(blocks.ref_count(a.table[0]), 1);
}

TEST(PrefixCache, TakingAnUnusedCachedBlockCountsAgainstTheFreeBlocks) {
  BlockManager blocks(3, kBlock, true);
  SequenceBlocks a = run(blocks, tokens(8, 0));
  blocks.free(a);  // 3 free: a0, a1 cached-unused plus one never used
  const PrefixHit hit = blocks.find_cached_prefix(tokens(12, 0), 11);
  EXPECT_EQ(hit.num_tokens, 8);
  EXPECT_TRUE(blocks.can_allocate(hit, 4));   // the hit's blocks + one more
  EXPECT_FALSE(blocks.can_allocate(hit, 5));  // would need two more
}

TEST(PrefixCache, AHashCollisionIsAMissNeverAWrongBlock) {
  // Every key collides: lookups must compare the chain and the tokens themselves.
  BlockManager blocks(8, kBlock, true,
                      [](uint64_t, std::span<const int32_t>) -> uint64_t { return 42; });
  run(blocks, tokens(8, 0));
  EXPECT_EQ(blocks.find_cached_prefix(tokens(8, 50), 8).num_tokens, 0);
  EXPECT_EQ(blocks.find_cached_prefix(tokens(8, 0), 8).num_tokens, 8);
  SequenceBlocks other = run(blocks, tokens(8, 50));
  EXPECT_EQ(blocks.num_cached_blocks(), 4);
  EXPECT_EQ(blocks.find_cached_prefix(tokens(8, 50), 8).blocks, other.table);
}

TEST(PrefixCache, ReferenceCountsHoldUnderPreemptionAndAbort) {
  BlockManager blocks(6, kBlock, true);
  const std::vector<int32_t> prompt = tokens(9, 7);
  SequenceBlocks a = run(blocks, prompt);  // a0 a1 cached, a2 private
  SequenceBlocks b = run(blocks, prompt);  // shares a0 a1
  const int32_t shared = a.table[0];
  EXPECT_EQ(blocks.ref_count(shared), 2);
  blocks.free(b);  // b preempted (recompute): the shared blocks stay with a
  EXPECT_EQ(blocks.ref_count(shared), 1);
  EXPECT_TRUE(b.table.empty());
  b = run(blocks, prompt);  // rescheduled: hits again
  EXPECT_EQ(b.table[0], shared);
  EXPECT_EQ(blocks.ref_count(shared), 2);
  blocks.free(a);  // a aborted
  blocks.free(b);  // b finished
  EXPECT_EQ(blocks.ref_count(shared), 0);
  EXPECT_EQ(blocks.num_free_blocks(), 6);  // nothing leaked
  EXPECT_EQ(blocks.num_cached_blocks(), 2);
  EXPECT_EQ(blocks.find_cached_prefix(prompt, 8).num_tokens, 8);
}

TEST(PrefixCache, TwoSequencesComputingTheSameBlockKeepOneEntry) {
  BlockManager blocks(8, kBlock, true);
  const std::vector<int32_t> prompt = tokens(8, 0);
  // Both scheduled in one step, before either registered anything.
  SequenceBlocks a, b;
  blocks.allocate(a, {}, 8);
  blocks.allocate(b, {}, 8);
  a.num_tokens = b.num_tokens = 8;
  blocks.cache_full_blocks(a, prompt);
  blocks.cache_full_blocks(b, prompt);  // finds a's entries: b's copies stay private
  EXPECT_EQ(blocks.num_cached_blocks(), 2);
  EXPECT_EQ(blocks.find_cached_prefix(prompt, 8).blocks, a.table);
  blocks.free(b);
  EXPECT_EQ(blocks.num_free_blocks(), 6);
  // b's chain still continues through a's entries when it grows.
  EXPECT_EQ(b.num_identified_blocks, 0);  // reset by free
}

TEST(PrefixCache, DisabledItNeverHitsNorRegisters) {
  BlockManager blocks(8, kBlock, false);
  run(blocks, tokens(8, 0));
  EXPECT_EQ(blocks.num_cached_blocks(), 0);
  EXPECT_EQ(blocks.find_cached_prefix(tokens(8, 0), 8).num_tokens, 0);
}

}  // namespace
}  // namespace attnres
