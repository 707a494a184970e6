// Renders a depth-attention matrix (engine/core/depth_attention.h) for `attnres inspect
// --prompt`: as a text table for the terminal, and as a heatmap PNG (rows = sublayers top to
// bottom, columns = sources left to right, one square cell each; colour from dark purple at 0
// to yellow at the matrix's largest weight, a viridis-like scale; light grey where a sublayer
// has no such source; a colour bar on the right, 0 at its bottom). The PNG has no text: the
// table and --json carry the labels.
#pragma once

#include <string>

#include "engine/core/depth_attention.h"

namespace attnres::cli {

// One line per sublayer with its weights, a header of source numbers and a legend naming
// each source column.
std::string depth_attention_table(const DepthAttentionLayout& layout,
                                  const DepthAttentionMatrix& matrix);

// Writes the heatmap; returns the weight the brightest colour stands for (the largest).
float write_depth_heatmap_png(const std::string& path, const DepthAttentionMatrix& matrix);

}  // namespace attnres::cli
