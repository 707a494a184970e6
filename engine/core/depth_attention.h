// Depth-attention introspection (ATTNRES.md §5): the vocabulary shared by the forward, the
// engine loop and the front ends for reporting the depth-mix weights alpha of a request.
//
// A matrix has one row per *mixing* step of the model's DepthPlan, in plan order (layer 0
// attention, layer 0 MLP, ..., and the final mix of variant 2b), and one column per source
// slot: bank entry j is column j, and the partial (always the last source of a mix) is column
// n, where n is the number of bank entries that row reads. So a row with n bank sources fills
// columns [0, n] and the picture is lower-triangular like the paper's Figure 7. Cells a row
// does not have are NaN. Row and column labels come with the layout; a column label names the
// bank entry that lives in that slot, and column n of a row is that row's partial.
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
  std::vector<int> row_sources;        // per row: the sources it mixes (n bank entries + 1)

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
