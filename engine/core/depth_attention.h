// Depth-attention introspection (docs/ATTNRES.md §5): the vocabulary shared by the forward, the
// engine loop and the front ends for reporting the depth-mix weights alpha of a request.
//
// A matrix has one row per *depth mix* of the model's DepthPlan, in plan order (layer 0
// attention, layer 0 MLP, ..., and the final mix of variant 2b; delta_v's attention has a
// second row for its V stream), and one column per source slot: the null source (when the
// model has one) is column 0, bank entry j the next columns in push order, and the partial
// (where it is a source, always the last) sits right after the bank entries its row reads.
// So the picture is lower-triangular like the paper's Figure 7. Cells a row does not have are
// NaN. Row and column labels come with the layout; a column label names what the source in
// that slot holds ("embedding", "attention output of layer 3", "embedding + block 1 ...").
//
// Plain header-only data: the engine loop (engine/sched) uses it without depending on the
// model code that builds the layout (engine/model/depth_attention_layout.h).
#pragma once

#include <limits>
#include <string>
#include <vector>

namespace attnres {

struct DepthAttentionLayout {
  std::vector<std::string> sublayers;  // row labels: "layer 3 attention", "layer 3 mlp", "final"
  std::vector<std::string> sources;    // column labels: "embedding", "after layer 1", ...
  std::vector<int> row_sources;        // per row: how many sources it mixes
  // Per row: the column of each of its sources, in the order the op reports them
  // ([null?] + bank + [partial?]).
  std::vector<std::vector<int>> row_columns;

  int rows() const { return static_cast<int>(sublayers.size()); }
  int cols() const { return static_cast<int>(sources.size()); }
  // A model without depth mixes (a plain pre-norm model) has nothing to report.
  bool empty() const { return sublayers.empty(); }
};

struct DepthAttentionMatrix {
  int rows = 0;
  int cols = 0;
  std::vector<float> values;  // row-major [rows, cols]; NaN in cells the row does not have

  float at(int r, int c) const { return values[static_cast<size_t>(r) * cols + c]; }
};

inline constexpr float kDepthAttentionUnused = std::numeric_limits<float>::quiet_NaN();

}  // namespace attnres
