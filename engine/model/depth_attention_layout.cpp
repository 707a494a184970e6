// Column labels follow how each variant fills its bank (docs/ATTNRES.md §2):
// - 2a (cumulative): entry 0 is the embedding; later entries are snapshots of the running
//   sum x, taken after a layer's MLP ("after layer 5") or, in full mode, also after its
//   attention ("after layer 5 attention"). The slot after the last stored entry only ever
//   holds a row's partial, the running sum itself: "partial (running sum)".
// - 2b (block sums with reset): entry k >= 2 is block k, the sum of the sublayer outputs of
//   layers [(k-1)P, kP); entry 1 started from the embedding, so it is "embedding + block 1";
//   the partial is the block being summed, which is the block that would be pushed next, so
//   every column is a block ("block 2 (layers 2-3)").
// - delta, delta_v, pre_gated: entry k >= 1 is one sublayer's output ("attention output of
//   layer 3"); delta_block: block k's delta x_end - x_start ("block 1 delta (layers 0-1)");
//   first_layer: layer 0's MLP output only. None of them has a partial column but
//   first_layer ("partial (running sum)"); the delta modes may put the null source first.
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

std::string layer_range(int block, int layers_per_block, int num_layers) {
  const int first = (block - 1) * layers_per_block;
  const int last = std::min(block * layers_per_block, num_layers) - 1;
  if (first == last) return "(layer " + std::to_string(first) + ")";
  return "(layers " + std::to_string(first) + "-" + std::to_string(last) + ")";
}

std::string block_label(int block, int layers_per_block, int num_layers) {
  return std::string(block == 1 ? "embedding + " : "") + "block " + std::to_string(block) + " " +
         layer_range(block, layers_per_block, num_layers);
}

// The labels of the bank entries in the order the plan pushes them.
std::vector<std::string> bank_labels(const DepthPlan& plan, int num_layers) {
  std::vector<std::string> bank = {"embedding"};
  for (const DepthStep& step : plan.steps) {
    const std::string sublayer = step.kind == SublayerKind::Attention ? "attention" : "mlp";
    if (step.push_and_reset_after_mix) {
      bank.push_back(block_label(static_cast<int>(bank.size()), plan.layers_per_block, num_layers));
    }
    if (step.push_after) {
      bank.push_back("after layer " + std::to_string(step.layer) +
                     (step.kind == SublayerKind::Attention ? " attention" : ""));
    }
    if (step.push_output_after) {
      bank.push_back(sublayer + " output of layer " + std::to_string(step.layer));
    }
    if (step.commit_open_entry) {
      const int block = static_cast<int>(bank.size());
      bank.push_back("block " + std::to_string(block) + " delta " +
                     layer_range(block, plan.layers_per_block, num_layers));
    }
  }
  return bank;
}

}  // namespace

DepthAttentionLayout make_depth_attention_layout(const DepthPlan& plan) {
  DepthAttentionLayout layout;
  int num_layers = 0;
  bool null_column = false;
  int first_bank = -1;  // the lowest bank entry any mix reads: it gets the first bank column
  for (const DepthStep& step : plan.steps) {
    if (step.kind != SublayerKind::Final) num_layers = std::max(num_layers, step.layer + 1);
    if (!step.mixes) continue;
    null_column = null_column || step.null_source;
    first_bank = first_bank < 0 ? step.bank_first : std::min(first_bank, step.bank_first);
  }
  if (first_bank < 0) return layout;                      // no mixes: nothing to report
  const int offset = (null_column ? 1 : 0) - first_bank;  // column of bank entry j: j + offset
  int width = 0;
  for (const DepthStep& step : plan.steps) {
    if (!step.mixes) continue;
    std::vector<int> columns;
    if (step.null_source) columns.push_back(0);
    for (int j = step.bank_first; j < step.bank_first + step.num_bank_sources; ++j) {
      columns.push_back(j + offset);
    }
    if (step.partial_is_source) columns.push_back(step.bank_first + step.num_bank_sources + offset);
    width = std::max(width, columns.back() + 1);
    const int rows = step.value_slot >= 0 ? 2 : 1;
    for (int r = 0; r < rows; ++r) {
      layout.sublayers.push_back(row_label(step) + (r == 1 ? " (V stream)" : ""));
      layout.row_sources.push_back(static_cast<int>(columns.size()));
      layout.row_columns.push_back(columns);
    }
  }
  const std::vector<std::string> bank = bank_labels(plan, num_layers);
  for (int c = 0; c < width; ++c) {
    const int j = c - offset;  // the bank entry of column c
    if (null_column && c == 0) {
      layout.sources.push_back("null source");
    } else if (j < static_cast<int>(bank.size())) {
      layout.sources.push_back(bank[j]);
    } else if (!plan.cumulative) {
      layout.sources.push_back(block_label(j, plan.layers_per_block, num_layers));
    } else {
      layout.sources.push_back("partial (running sum)");
    }
  }
  return layout;
}

}  // namespace attnres
