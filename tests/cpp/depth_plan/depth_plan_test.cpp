// The depth plan against the variants' pseudocode in ATTNRES.md §2, written out by hand
// for small models: which bank entries each sublayer reads, where the bank grows, and how
// the Phase-1 groups fall.
#include "engine/model/depth_plan.h"

#include <gtest/gtest.h>

#include "tests/cpp/depth_plan/plan_test_config.h"

#include "engine/core/error.h"

namespace attnres {
namespace {

using test::config;

std::vector<int> sources_read(const DepthPlan& plan) {
  std::vector<int> n;
  for (const DepthStep& s : plan.steps) n.push_back(s.mixes ? s.num_bank_sources : -1);
  return n;
}

TEST(DepthPlan, CumulativeBlockMode) {
  // 2a, L = 6, 3 blocks -> P = 2. bank = [e]; after the MLP of layers 1 and 3 the bank
  // grows (layer 5's snapshot is never read, so it is not taken).
  //   L0 attn [e | x]  L0 mlp [e | x]  L1 attn [e | x]  L1 mlp [e | x] -> bank += x
  //   L2 .. L3 read [e, b1 | x]                                       -> bank += x
  //   L4 .. L5 read [e, b1, b2 | x]; final = norm(x), no mix
  DepthPlan plan = DepthPlan::build(config(AttnResMode::Block, 6, 3), false);
  EXPECT_EQ(sources_read(plan), (std::vector<int>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, -1}));
  ASSERT_EQ(plan.groups.size(), 3u);
  for (const DepthGroup& g : plan.groups) EXPECT_EQ(g.steps.size(), 4u);
  EXPECT_TRUE(plan.steps[3].push_after);    // L1 mlp
  EXPECT_TRUE(plan.steps[7].push_after);    // L3 mlp
  EXPECT_FALSE(plan.steps[11].push_after);  // L5 mlp: nobody reads it
  EXPECT_EQ(plan.bank_capacity, 3);
  EXPECT_TRUE(plan.cumulative);
}

TEST(DepthPlan, UnevenBlocksUseCeil) {
  // L = 5, 2 blocks -> P = ceil(5 / 2) = 3: the bank grows after layer 2 only.
  DepthPlan plan = DepthPlan::build(config(AttnResMode::Block, 5, 2), false);
  EXPECT_EQ(plan.layers_per_block, 3);
  EXPECT_EQ(sources_read(plan), (std::vector<int>{1, 1, 1, 1, 1, 1, 2, 2, 2, 2, -1}));
}

TEST(DepthPlan, CumulativeFullMode) {
  // 2a full: the bank grows after every sublayer, so sublayer k reads k + 1 entries and
  // every Phase-1 group has one member.
  DepthPlan plan = DepthPlan::build(config(AttnResMode::Full, 3, 3), false);
  EXPECT_EQ(sources_read(plan), (std::vector<int>{1, 2, 3, 4, 5, 6, -1}));
  EXPECT_EQ(plan.groups.size(), 6u);
  EXPECT_EQ(plan.max_group_size(), 1);
}

TEST(DepthPlan, BlockSumsWithResetAndFinalMix) {
  // 2b, L = 6, P = 2. Layer i attention mixes first, then (i > 0, i % P == 0) pushes the
  // block sum and resets it:
  //   L0 attn [e | p]  L0 mlp [e | p]  L1 attn [e | p]  L1 mlp [e | p]
  //   L2 attn [e | p] -> bank += p; p = 0   L2 mlp [e, b1 | p]  L3 attn/mlp [e, b1 | p]
  //   L4 attn [e, b1 | p] -> bank += p; p = 0   L4 mlp .. L5 mlp [e, b1, b2 | p]
  //   final mix [e, b1, b2 | p]
  DepthPlan plan = DepthPlan::build(config(AttnResMode::Block, 6, 3), true);
  EXPECT_EQ(sources_read(plan), (std::vector<int>{1, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
  EXPECT_TRUE(plan.steps[4].push_and_reset_after_mix);  // L2 attn
  EXPECT_TRUE(plan.steps[8].push_and_reset_after_mix);  // L4 attn
  EXPECT_FALSE(plan.steps[0].push_and_reset_after_mix);
  ASSERT_EQ(plan.groups.size(), 3u);
  EXPECT_EQ(plan.groups[0].steps.size(), 5u);  // L0..L1 and L2's attention
  EXPECT_EQ(plan.groups[2].steps.size(), 4u);  // L4 mlp, L5 attn, L5 mlp, final
  EXPECT_EQ(plan.steps.back().kind, SublayerKind::Final);
  EXPECT_EQ(plan.steps.back().slot, 3);
  EXPECT_FALSE(plan.cumulative);
}

TEST(DepthPlan, PlainModelHasNoMixes) {
  DepthPlan plan = DepthPlan::build(config(AttnResMode::None, 4, 0), false);
  for (const DepthStep& s : plan.steps) EXPECT_FALSE(s.mixes);
  EXPECT_TRUE(plan.groups.empty());
}

TEST(DepthPlan, FinalMixNeedsBlockMode) {
  EXPECT_THROW(DepthPlan::build(config(AttnResMode::Full, 3, 3), true), Error);
}

TEST(DepthPlan, DescribeNamesSourcesAndGrowth) {
  const std::string text = DepthPlan::build(config(AttnResMode::Block, 6, 3), true).describe();
  EXPECT_NE(text.find("mix[b0 b1 p]"), std::string::npos) << text;
  EXPECT_NE(text.find("bank += p; p = 0"), std::string::npos) << text;
}

}  // namespace
}  // namespace attnres
