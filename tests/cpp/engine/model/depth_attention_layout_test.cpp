// The depth-attention layout (rows, columns, labels) of each variant, written out by hand from
// docs/ATTNRES.md §2 for small models: one row per mixing step with n + 1 sources, and a label per
// source slot naming the bank entry that lives there.
#include "engine/model/depth_attention_layout.h"

#include <gtest/gtest.h>

#include "tests/cpp/engine/model/plan_test_config.h"

namespace attnres {
namespace {

using test::config;

using Labels = std::vector<std::string>;

TEST(DepthAttentionLayout, CumulativeBlockMode) {
  // 6 layers, 3 blocks: P = 2; snapshots after layers 1 and 3 (the one after 5 is never read).
  const auto layout =
      make_depth_attention_layout(DepthPlan::build(config(AttnResMode::Block, 6, 3), false));
  EXPECT_EQ(layout.sublayers,
            (Labels{"layer 0 attention", "layer 0 mlp", "layer 1 attention", "layer 1 mlp",
                    "layer 2 attention", "layer 2 mlp", "layer 3 attention", "layer 3 mlp",
                    "layer 4 attention", "layer 4 mlp", "layer 5 attention", "layer 5 mlp"}));
  EXPECT_EQ(layout.sources,
            (Labels{"embedding", "after layer 1", "after layer 3", "partial (running sum)"}));
  EXPECT_EQ(layout.row_sources, (std::vector<int>{2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4}));
  EXPECT_EQ(layout.rows(), 12);
  EXPECT_EQ(layout.cols(), 4);
}

TEST(DepthAttentionLayout, CumulativeFullMode) {
  const auto layout =
      make_depth_attention_layout(DepthPlan::build(config(AttnResMode::Full, 2, 1), false));
  EXPECT_EQ(layout.sublayers,
            (Labels{"layer 0 attention", "layer 0 mlp", "layer 1 attention", "layer 1 mlp"}));
  EXPECT_EQ(layout.sources, (Labels{"embedding", "after layer 0 attention", "after layer 0",
                                    "after layer 1 attention", "partial (running sum)"}));
  EXPECT_EQ(layout.row_sources, (std::vector<int>{2, 3, 4, 5}));
}

TEST(DepthAttentionLayout, BlockSumsWithResetAndFinalMix) {
  // 5 layers, 3 blocks: P = 2, blocks {0,1}, {2,3}, {4}; the final mix sees all three.
  const auto layout =
      make_depth_attention_layout(DepthPlan::build(config(AttnResMode::Block, 5, 3), true));
  ASSERT_EQ(layout.rows(), 11);
  EXPECT_EQ(layout.sublayers.front(), "layer 0 attention");
  EXPECT_EQ(layout.sublayers.back(), "final");
  EXPECT_EQ(layout.sources, (Labels{"embedding", "embedding + block 1 (layers 0-1)",
                                    "block 2 (layers 2-3)", "block 3 (layer 4)"}));
  EXPECT_EQ(layout.row_sources, (std::vector<int>{2, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4}));
}

TEST(DepthAttentionLayout, DeltaVWithNullSource) {
  // Null source first, then the sublayer outputs; no partial column; the V stream is a row.
  const auto layout = make_depth_attention_layout(
      DepthPlan::build(config(AttnResMode::DeltaV, 2, 2, "bias", true), false));
  EXPECT_EQ(layout.sublayers,
            (Labels{"layer 0 attention", "layer 0 attention (V stream)", "layer 0 mlp",
                    "layer 1 attention", "layer 1 attention (V stream)", "layer 1 mlp"}));
  EXPECT_EQ(layout.sources, (Labels{"null source", "embedding", "attention output of layer 0",
                                    "mlp output of layer 0", "attention output of layer 1"}));
  EXPECT_EQ(layout.row_sources, (std::vector<int>{2, 2, 3, 4, 4, 5}));
  EXPECT_EQ(layout.row_columns[2], (std::vector<int>{0, 1, 2}));
}

TEST(DepthAttentionLayout, DeltaBlockNamesBlockDeltas) {
  const auto layout =
      make_depth_attention_layout(DepthPlan::build(config(AttnResMode::DeltaBlock, 4, 2), false));
  EXPECT_EQ(layout.sources, (Labels{"embedding", "block 1 delta (layers 0-1)"}));
  EXPECT_EQ(layout.row_columns.back(), (std::vector<int>{0, 1}));
}

TEST(DepthAttentionLayout, FirstLayerHasNoRowsForLayerZero) {
  const auto layout =
      make_depth_attention_layout(DepthPlan::build(config(AttnResMode::FirstLayer, 3, 3), false));
  EXPECT_EQ(layout.sublayers.front(), "layer 1 attention");
  EXPECT_EQ(layout.rows(), 4);
  EXPECT_EQ(layout.sources, (Labels{"mlp output of layer 0", "partial (running sum)"}));
  EXPECT_EQ(layout.row_columns[0], (std::vector<int>{0, 1}));
}

TEST(DepthAttentionLayout, PlainModelHasNone) {
  const auto layout =
      make_depth_attention_layout(DepthPlan::build(config(AttnResMode::None, 4, 1), false));
  EXPECT_TRUE(layout.empty());
  EXPECT_EQ(layout.cols(), 0);
}

}  // namespace
}  // namespace attnres
