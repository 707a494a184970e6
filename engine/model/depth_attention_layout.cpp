// Column labels follow how each variant fills its bank (ATTNRES.md §2):
// - 2a (cumulative): entry 0 is the embedding; later entries are snapshots of the running
//   sum x, taken after a layer's MLP ("after layer 5") or, in full mode, also after its
//   attention ("after layer 5 attention"). The slot after the last stored entry only ever
//   holds a row's partial, the running sum itself: "partial (running sum)".
// - 2b (block sums with reset): entry k >= 1 is block k, the sum of the sublayer outputs of
//   layers [(k-1)P, kP); the partial is the block being summed, which is the block that
//   would be pushed next, so every column is a block ("block 2 (layers 2-3)").
#include "engine/model/depth_attention_layout.h"

#include <algorithm>
#include <string>

namespace attnres {
namespace {

std::string row_label(const DepthStep& step) {
  switch (step.kind) {
    case SublayerKind::Attention:
      return "layer " + std::to_string(step.layer) + " attention";
    case SublayerKind::Mlp:
      return "layer " + std::to_string(step.layer) + " mlp";
    case SublayerKind::Final:
      return "final";
  }
  return "?";
}

std::string block_label(int block, int layers_per_block, int num_layers) {
  const int first = (block - 1) * layers_per_block;
  const int last = std::min(block * layers_per_block, num_layers) - 1;
  std::string label = "block " + std::to_string(block) + " (layer";
  if (first == last) return label + " " + std::to_string(first) + ")";
  return label + "s " + std::to_string(first) + "-" + std::to_string(last) + ")";
}

}  // namespace

DepthAttentionLayout make_depth_attention_layout(const DepthPlan& plan) {
  DepthAttentionLayout layout;
  int width = 0;
  for (const DepthStep& step : plan.steps) {
    if (!step.mixes) continue;
    layout.sublayers.push_back(row_label(step));
    layout.row_sources.push_back(step.num_bank_sources + 1);
    width = std::max(width, step.num_bank_sources + 1);
  }
  if (layout.empty()) return layout;

  int num_layers = 0;
  for (const DepthStep& step : plan.steps) {
    if (step.kind != SublayerKind::Final) num_layers = std::max(num_layers, step.layer + 1);
  }
  // The labels of the bank entries in the order the plan pushes them.
  std::vector<std::string> bank = {"embedding"};
  for (const DepthStep& step : plan.steps) {
    if (step.push_and_reset_after_mix) {
      bank.push_back(block_label(static_cast<int>(bank.size()), plan.layers_per_block, num_layers));
    }
    if (step.push_after) {
      bank.push_back("after layer " + std::to_string(step.layer) +
                     (step.kind == SublayerKind::Attention ? " attention" : ""));
    }
  }
  for (int c = 0; c < width; ++c) {
    if (c < static_cast<int>(bank.size())) {
      layout.sources.push_back(bank[c]);
    } else if (!plan.cumulative) {
      layout.sources.push_back(block_label(c, plan.layers_per_block, num_layers));
    } else {
      layout.sources.push_back("partial (running sum)");
    }
  }
  return layout;
}

}  // namespace attnres
