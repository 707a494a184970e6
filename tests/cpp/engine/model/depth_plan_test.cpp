// The depth plan against the variants' pseudocode in docs/ATTNRES.md §2, written out by hand
// for small models: which bank entries each sublayer reads, where the bank grows, and how
// the Phase-1 groups fall.
#include "engine/model/depth_plan.h"

#include <gtest/gtest.h>

#include "tests/cpp/engine/model/plan_test_config.h"

#include "engine/core/error.h"

namespace attnres {
namespace {

using test::config;

std::vector<int> sources_read(const DepthPlan& plan) {
  std::vector<int> n;
  for (const DepthStep& s : plan.steps) n.push_back(s.mixes ? s.num_bank_sources : -1);
  return n;
}

// Per step: how many of its bank sources its Phase 2 merges (pushed after its group's Phase 1).
std::vector<int> newer_read(const DepthPlan& plan) {
  std::vector<int> n;
  for (const DepthStep& s : plan.steps) n.push_back(s.mixes ? s.num_newer_sources : -1);
  return n;
}

// Every group's Phase 1 reads a prefix its steps all share, and each step reads exactly
// that prefix plus its newer entries.
void expect_groups_consistent(const DepthPlan& plan) {
  for (const DepthGroup& g : plan.groups) {
    for (int i : g.steps) {
      const DepthStep& s = plan.steps[i];
      EXPECT_EQ(s.bank_first, g.bank_first) << i;
      EXPECT_EQ(s.num_bank_sources, g.num_bank_sources + s.num_newer_sources) << i;
    }
    EXPECT_EQ(plan.steps[g.steps.front()].num_newer_sources, 0);
    EXPECT_LE(g.num_slots, 8);
  }
}

TEST(DepthPlan, CumulativeBlockMode) {
  // 2a, L = 6, 3 blocks -> P = 2. bank = [e]; after the MLP of layers 1 and 3 the bank
  // grows (layer 5's snapshot is never read, so it is not taken).
  //   L0 attn [e | x]  L0 mlp [e | x]  L1 attn [e | x]  L1 mlp [e | x] -> bank += x
  //   L2 .. L3 read [e, b1 | x]                                       -> bank += x
  //   L4 .. L5 read [e, b1, b2 | x]; final = norm(x), no mix
  // Phase 1 groups take 8 query rows: the first spans two blocks, the second block's 4 steps
  // merging the entry pushed after layer 1 in Phase 2.
  DepthPlan plan = DepthPlan::build(config(AttnResMode::Block, 6, 3), false);
  EXPECT_EQ(sources_read(plan), (std::vector<int>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, -1}));
  EXPECT_EQ(newer_read(plan), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, -1}));
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.groups[0].steps.size(), 8u);
  EXPECT_EQ(plan.groups[1].steps.size(), 4u);
  expect_groups_consistent(plan);
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
  // 2a full: the bank grows after every sublayer, so sublayer k reads k + 1 entries. One
  // Phase-1 pass over [e] serves all six; sublayer k's Phase 2 merges the k entries since.
  DepthPlan plan = DepthPlan::build(config(AttnResMode::Full, 3, 3), false);
  EXPECT_EQ(sources_read(plan), (std::vector<int>{1, 2, 3, 4, 5, 6, -1}));
  EXPECT_EQ(newer_read(plan), (std::vector<int>{0, 1, 2, 3, 4, 5, -1}));
  EXPECT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(plan.max_group_size(), 6);
  expect_groups_consistent(plan);
}

TEST(DepthPlan, FullModeGroupsHoldEightSublayers) {
  // 28 layers (the 0.6B shape): 56 mixing steps in 7 groups of 8, group g's Phase 1 reading
  // the 8 g + 1 entries there are when it starts.
  DepthPlan plan = DepthPlan::build(config(AttnResMode::Full, 28, 28), false);
  ASSERT_EQ(plan.groups.size(), 7u);
  for (int g = 0; g < 7; ++g) {
    EXPECT_EQ(plan.groups[g].num_bank_sources, 8 * g + 1) << g;
    EXPECT_EQ(plan.groups[g].steps.size(), 8u) << g;
  }
  expect_groups_consistent(plan);
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
  // Groups of 8 rows: L0 attn .. L3 attn, then L3 mlp .. final.
  EXPECT_EQ(newer_read(plan), (std::vector<int>{0, 0, 0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1}));
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.groups[0].steps.size(), 8u);
  EXPECT_EQ(plan.groups[1].steps.size(), 5u);
  expect_groups_consistent(plan);
  EXPECT_EQ(plan.steps.back().kind, SublayerKind::Final);
  EXPECT_EQ(plan.steps.back().slot, 4);
  EXPECT_FALSE(plan.cumulative);
}

std::vector<int> first_read(const DepthPlan& plan) {
  std::vector<int> first;
  for (const DepthStep& s : plan.steps) first.push_back(s.mixes ? s.bank_first : -1);
  return first;
}

TEST(DepthPlan, DeltaModeReadsSublayerOutputs) {
  // delta, L = 3: bank = [e]; every sublayer reads the whole bank (x is added, not a
  // source), then pushes its output. The last MLP output is never read: not stored.
  DepthPlan plan =
      DepthPlan::build(config(AttnResMode::Delta, 3, 3, "sigmoid_vector", true), false);
  EXPECT_EQ(sources_read(plan), (std::vector<int>{1, 2, 3, 4, 5, 6, -1}));
  for (int i = 0; i < 6; ++i) {
    const DepthStep& s = plan.steps[i];
    EXPECT_FALSE(s.partial_is_source);
    EXPECT_TRUE(s.adds_partial);
    EXPECT_TRUE(s.null_source);
    EXPECT_TRUE(s.gated);
    EXPECT_FALSE(s.pre_gated);
    EXPECT_EQ(s.push_output_after, i < 5) << i;
  }
  // The bank grows at every sublayer: one Phase-1 pass over [e], the rest merged in Phase 2.
  EXPECT_EQ(plan.groups.size(), 1u);
  EXPECT_EQ(newer_read(plan), (std::vector<int>{0, 1, 2, 3, 4, 5, -1}));
  expect_groups_consistent(plan);
  EXPECT_EQ(plan.bank_capacity, 6);
  EXPECT_FALSE(plan.has_final_mix);
}

TEST(DepthPlan, DeltaBlockSharesPhaseOneAcrossABlock) {
  // delta_block, L = 5, 2 blocks -> P = 3: layers 0-2 read [e], layers 3-4 read [e, d1]
  // where d1 = x - e after layer 2, summed in the open entry as the outputs arrive; the
  // last, partial block's delta is never read, so nothing accumulates there.
  DepthPlan plan = DepthPlan::build(config(AttnResMode::DeltaBlock, 5, 2), false);
  EXPECT_EQ(sources_read(plan), (std::vector<int>{1, 1, 1, 1, 1, 1, 2, 2, 2, 2, -1}));
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.groups[0].steps.size(), 8u);  // 8 rows: block 0 and two of block 1
  EXPECT_EQ(plan.groups[1].steps.size(), 2u);
  EXPECT_EQ(newer_read(plan), (std::vector<int>{0, 0, 0, 0, 0, 0, 1, 1, 0, 0, -1}));
  expect_groups_consistent(plan);
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(plan.steps[i].accumulate_output) << i;
  for (int i = 6; i < 10; ++i) EXPECT_FALSE(plan.steps[i].accumulate_output) << i;
  EXPECT_TRUE(plan.steps[5].commit_open_entry);  // L2 mlp
  EXPECT_FALSE(plan.steps[9].commit_open_entry);
  EXPECT_FALSE(plan.steps[0].gated);  // gate "bias": nothing after the mix
  EXPECT_EQ(plan.bank_capacity, 2);
}

TEST(DepthPlan, MoreBlocksThanLayersMeansOneLayerPerBlock) {
  DepthPlan plan = DepthPlan::build(config(AttnResMode::DeltaBlock, 3, 10), false);
  EXPECT_EQ(plan.layers_per_block, 1);
  EXPECT_EQ(sources_read(plan), (std::vector<int>{1, 1, 2, 2, 3, 3, -1}));
}

TEST(DepthPlan, DeltaVHasASecondQueryRow) {
  DepthPlan plan = DepthPlan::build(config(AttnResMode::DeltaV, 3, 3), false);
  EXPECT_EQ(plan.steps[0].value_slot, 1);  // attention: main row 0, V stream row 1
  EXPECT_EQ(plan.steps[1].value_slot, -1);
  EXPECT_EQ(plan.steps[1].slot, 2);
  EXPECT_EQ(plan.steps[2].slot, 3);  // layer 1 attention: rows 3 and 4
  EXPECT_EQ(plan.steps[2].value_slot, 4);
  // Layer 2's attention would need rows 6 and 7 after the MLP's 5: it fits; its MLP does not.
  ASSERT_EQ(plan.groups.size(), 2u);
  EXPECT_EQ(plan.groups[0].num_slots, 8);
  EXPECT_EQ(plan.max_group_size(), 8);
  EXPECT_EQ(plan.steps[5].group, 1);
  EXPECT_EQ(plan.steps[5].slot, 0);
  expect_groups_consistent(plan);
}

TEST(DepthPlan, FirstLayerMixesThePartialWithLayerZerosMlpOutput) {
  // Layer 0 is unmixed and stores its MLP output (bank entry 1); every later sublayer mixes
  // [b1 | x] with no gate, and they share one Phase-1 group of at most 8 rows.
  DepthPlan plan =
      DepthPlan::build(config(AttnResMode::FirstLayer, 6, 3, "sigmoid_scalar", true), false);
  EXPECT_EQ(sources_read(plan), (std::vector<int>{-1, -1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1}));
  EXPECT_EQ(first_read(plan), (std::vector<int>{-1, -1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1}));
  EXPECT_TRUE(plan.steps[1].push_output_after);
  for (size_t i = 2; i < 12; ++i) {
    EXPECT_TRUE(plan.steps[i].partial_is_source);
    EXPECT_FALSE(plan.steps[i].gated);
    EXPECT_FALSE(plan.steps[i].null_source);
    EXPECT_FALSE(plan.steps[i].push_output_after);
  }
  ASSERT_EQ(plan.groups.size(), 2u);  // 10 mixing steps: 8 + 2
  EXPECT_EQ(plan.groups[0].num_slots, 8);
  EXPECT_EQ(plan.bank_capacity, 2);
}

TEST(DepthPlan, PreGatedStepsAreGroupsOfTheirOwn) {
  DepthPlan plan =
      DepthPlan::build(config(AttnResMode::PreGated, 2, 2, "sigmoid_vector", true), false);
  EXPECT_EQ(sources_read(plan), (std::vector<int>{1, 2, 3, 4, -1}));
  EXPECT_EQ(plan.groups.size(), 4u);
  expect_groups_consistent(plan);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(plan.steps[i].pre_gated);
    EXPECT_FALSE(plan.steps[i].gated);        // pre_gated has no gate after the mix
    EXPECT_FALSE(plan.steps[i].null_source);  // nor a null source
  }
}

TEST(DepthPlan, GatesApplyToBlockAndFullMixesButNotTheFinalMix) {
  DepthPlan plan = DepthPlan::build(config(AttnResMode::Block, 4, 2, "learnable_alpha"), true);
  for (size_t i = 0; i + 1 < plan.steps.size(); ++i) EXPECT_TRUE(plan.steps[i].gated);
  EXPECT_FALSE(plan.steps.back().gated);
  EXPECT_TRUE(plan.steps.back().partial_is_source);
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
  const std::string delta =
      DepthPlan::build(config(AttnResMode::Delta, 2, 2, "bias", true), false).describe();
  EXPECT_NE(delta.find("x + mix[null b0 b1]"), std::string::npos) << delta;
  EXPECT_NE(delta.find("bank += output"), std::string::npos) << delta;
  EXPECT_NE(delta.find("Phase 2 merges the newest 1"), std::string::npos) << delta;
}

}  // namespace
}  // namespace attnres
