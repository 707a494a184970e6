// Text and PNG renderings of a depth-attention matrix (see depth_heatmap.h). The colour scale
// interpolates nine samples of matplotlib's viridis (perceptually uniform, its lightness rises
// monotonically with the value, so brighter always means more weight).
#include "server/cli/depth_heatmap.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "server/cli/png_writer.h"

namespace attnres::cli {
namespace {

using Rgb = std::array<uint8_t, 3>;

constexpr std::array<Rgb, 9> kViridis = {{{68, 1, 84},
                                          {71, 44, 122},
                                          {59, 81, 139},
                                          {44, 113, 142},
                                          {33, 144, 141},
                                          {39, 173, 129},
                                          {92, 200, 99},
                                          {170, 220, 50},
                                          {253, 231, 37}}};
constexpr Rgb kUnused = {225, 225, 225};  // a cell the sublayer does not have
constexpr Rgb kBackground = {255, 255, 255};

// The colour of x in [0, 1].
Rgb colour(float x) {
  x = std::clamp(x, 0.0f, 1.0f) * static_cast<float>(kViridis.size() - 1);
  const int i = std::min(static_cast<int>(x), static_cast<int>(kViridis.size()) - 2);
  const float f = x - static_cast<float>(i);
  Rgb c{};
  for (int k = 0; k < 3; ++k) {
    c[k] = static_cast<uint8_t>(std::lround((1.0f - f) * kViridis[i][k] + f * kViridis[i + 1][k]));
  }
  return c;
}

}  // namespace

std::string depth_attention_table(const DepthAttentionLayout& layout,
                                  const DepthAttentionMatrix& matrix) {
  size_t label_width = 8;
  for (const std::string& s : layout.sublayers) label_width = std::max(label_width, s.size());
  std::string out;
  char cell[32];
  out += std::string(label_width, ' ');
  for (int c = 0; c < matrix.cols; ++c) {
    char name[16];
    std::snprintf(name, sizeof(name), "s%d", c);
    std::snprintf(cell, sizeof(cell), " %7s", name);
    out += cell;
  }
  out += "\n";
  for (int r = 0; r < matrix.rows; ++r) {
    std::string label = r < layout.rows() ? layout.sublayers[r] : "";
    label.resize(label_width, ' ');
    out += label;
    for (int c = 0; c < matrix.cols; ++c) {
      const float v = matrix.at(r, c);
      if (std::isnan(v)) {
        std::snprintf(cell, sizeof(cell), " %7s", "");
      } else {
        std::snprintf(cell, sizeof(cell), " %7.4f", static_cast<double>(v));
      }
      out += cell;
    }
    out += "\n";
  }
  out += "sources (column n of a row is that row's partial, its last source):\n";
  for (int c = 0; c < layout.cols(); ++c) {
    std::snprintf(cell, sizeof(cell), "  s%d = ", c);
    out += cell;
    out += layout.sources[c];
    out += "\n";
  }
  return out;
}

float write_depth_heatmap_png(const std::string& path, const DepthAttentionMatrix& matrix) {
  float top = 0.0f;
  for (float v : matrix.values) {
    if (std::isfinite(v)) top = std::max(top, v);
  }
  if (top <= 0.0f) top = 1.0f;
  const int longest = std::max(matrix.rows, matrix.cols);
  const int cell = std::clamp(640 / std::max(longest, 1), 12, 48);
  const int margin = cell / 2, gap = 1;
  const int bar_width = std::max(cell / 2, 8);
  const int grid_w = matrix.cols * cell, grid_h = matrix.rows * cell;
  const int width = margin + grid_w + cell + bar_width + margin;
  const int height = margin + grid_h + margin;
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  auto fill = [&](int x0, int y0, int w, int h, const Rgb& c) {
    for (int y = y0; y < y0 + h; ++y)
      for (int x = x0; x < x0 + w; ++x) {
        uint8_t* p = rgb.data() + (static_cast<size_t>(y) * width + x) * 3;
        p[0] = c[0], p[1] = c[1], p[2] = c[2];
      }
  };
  fill(0, 0, width, height, kBackground);
  for (int r = 0; r < matrix.rows; ++r)
    for (int c = 0; c < matrix.cols; ++c) {
      const float v = matrix.at(r, c);
      const Rgb colour_of_cell = std::isnan(v) ? kUnused : colour(v / top);
      fill(margin + c * cell + gap, margin + r * cell + gap, cell - 2 * gap, cell - 2 * gap,
           colour_of_cell);
    }
  // The colour bar: 0 at the bottom, `top` at the top.
  const int bar_x = margin + grid_w + cell;
  for (int y = 0; y < grid_h; ++y) {
    const float x = grid_h > 1 ? 1.0f - static_cast<float>(y) / static_cast<float>(grid_h - 1) : 1;
    fill(bar_x, margin + y, bar_width, 1, colour(x));
  }
  write_png_rgb(path, width, height, rgb);
  return top;
}

}  // namespace attnres::cli
