// BlockManager: allocation, growth across block boundaries, free.
#include "engine/sched/block_manager.h"

#include <gtest/gtest.h>

#include <set>

namespace attnres {
namespace {

TEST(BlockManager, GrowsOneBlockPerBlockSizeTokensAndFreesEverything) {
  BlockManager blocks(4, 4);
  SequenceBlocks a;
  EXPECT_TRUE(blocks.can_append(a, 5));
  blocks.append(a, 5);  // 5 tokens: 2 blocks
  EXPECT_EQ(a.table.size(), 2u);
  a.num_tokens = 5;
  EXPECT_TRUE(blocks.can_append(a, 3));   // up to 8 tokens: still 2 blocks
  EXPECT_TRUE(blocks.can_append(a, 11));  // 16 tokens: all 4 blocks
  EXPECT_FALSE(blocks.can_append(a, 12));
  SequenceBlocks b;
  blocks.append(b, 8);
  EXPECT_EQ(blocks.num_free_blocks(), 0);
  std::set<int32_t> ids(a.table.begin(), a.table.end());
  ids.insert(b.table.begin(), b.table.end());
  EXPECT_EQ(ids.size(), 4u);  // no block handed out twice
  blocks.free(a);
  EXPECT_TRUE(a.table.empty());
  EXPECT_EQ(a.num_tokens, 0);
  blocks.free(b);
  EXPECT_EQ(blocks.num_free_blocks(), 4);
}

}  // namespace
}  // namespace attnres
