#include "engine/core/quant_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/quant_k256.h"
#include "engine/core/quant_packing.h"
#include "engine/core/quant_search.h"

namespace attnres {
namespace {

void check_cols(DType format, int64_t cols) {
  ATTNRES_CHECK(is_block_quantized(format),
                std::string(dtype_name(format)) + " is not a block-quantized format");
  const int64_t multiple = quant_row_multiple(format);
  if (cols <= 0 || cols % multiple != 0)
    throw Error(std::string(dtype_name(format)) + ": a row of " + std::to_string(cols) +
                " weights is not a positive multiple of " + std::to_string(multiple));
}

bool is_k256(DType format) { return format == DType::Q4_K256 || format == DType::Q6_K256; }

void store_f16(uint8_t* p, uint16_t h) { std::memcpy(p, &h, 2); }
uint16_t load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

}  // namespace

int64_t quant_row_multiple(DType format) {
  return is_k256(format) ? kQuantSuperBlock : kQuantBlock;
}

size_t quant_row_bytes(DType format, int64_t cols) {
  check_cols(format, cols);
  const auto n = static_cast<size_t>(cols);
  switch (format) {
    case DType::Q4_K256:
      return n / 2 + n / 16;
    case DType::Q6_K256:
      return quant_super_scales_offset(format, cols) + n / 128;
    default:
      return quant_scales_offset(format, cols) + (format == DType::Q4_B32 ? 4 : 2) * (n / 32);
  }
}

size_t quant_scales_offset(DType format, int64_t cols) {
  check_cols(format, cols);
  const auto n = static_cast<size_t>(cols);
  switch (format) {
    case DType::Q8_B32:
      return n;
    case DType::Q6_B32:
    case DType::Q6_K256:
      return n / 2 + n / 4;
    default:  // Q4_B32, Q4_K256
      return n / 2;
  }
}

size_t quant_mins_offset(DType format, int64_t cols) {
  ATTNRES_CHECK(format == DType::Q4_B32, "only Q4_B32 rows have mins");
  return quant_scales_offset(format, cols) + 2 * static_cast<size_t>(cols / kQuantBlock);
}

size_t quant_highs_offset(DType format, int64_t cols) {
  ATTNRES_CHECK(format == DType::Q6_B32 || format == DType::Q6_K256,
                "only Q6_B32 / Q6_K256 rows have high bits");
  check_cols(format, cols);
  return static_cast<size_t>(cols / 2);
}

size_t quant_super_scales_offset(DType format, int64_t cols) {
  ATTNRES_CHECK(format == DType::Q6_K256, "only Q6_K256 rows have f16 super-block scales");
  return quant_scales_offset(format, cols) + static_cast<size_t>(cols / 16);
}

BlockScaleMin q4k_block_params(const uint8_t* params, int j) {
  const float d = f16_to_f32(load_f16(params)), dmin = f16_to_f32(load_f16(params + 2));
  const int sc = params[4 + j] & 63;
  const int mn = (params[12 + j % 4] >> (j < 4 ? 0 : 4) & 15) | (params[4 + j] >> 6) << 4;
  return {d * static_cast<float>(sc), -(dmin * static_cast<float>(mn))};
}

void quantize_row(DType format, const float* x, int64_t cols, uint8_t* row) {
  check_cols(format, cols);
  for (int64_t k = 0; k < cols; ++k) {
    if (!std::isfinite(x[k]))
      throw Error("quantize: weight " + std::to_string(k) + " of a row is not finite");
  }
  if (format == DType::Q4_K256) return quantize_q4k_row(x, cols, row);
  if (format == DType::Q6_K256) return quantize_q6k_row(x, cols, row);
  const int64_t blocks = cols / kQuantBlock;
  uint8_t* scales = row + quant_scales_offset(format, cols);
  if (format == DType::Q8_B32) {
    auto* q = reinterpret_cast<int8_t*>(row);
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + b * kQuantBlock;
      const float d = choose_symmetric_scale(xb, kQuantBlock, 127);
      const uint16_t dh = f32_to_f16(d);  // exact: d is an f16 value
      for (int j = 0; j < kQuantBlock; ++j) {
        const float v = d == 0.0f ? 0.0f : std::nearbyint(xb[j] / d);
        q[b * kQuantBlock + j] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
      }
      store_f16(scales + 2 * b, dh);
    }
    return;
  }
  if (format == DType::Q6_B32) {
    uint8_t* high = row + quant_highs_offset(format, cols);
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + b * kQuantBlock;
      const float d = choose_symmetric_scale(xb, kQuantBlock, 31);
      const uint16_t dh = f32_to_f16(d);  // exact: d is an f16 value
      uint8_t q[kQuantBlock];
      for (int j = 0; j < kQuantBlock; ++j) {
        const float v = d == 0.0f ? 0.0f : std::nearbyint(xb[j] / d);
        q[j] = static_cast<uint8_t>(32 + static_cast<int>(std::clamp(v, -31.0f, 31.0f)));
      }
      quant_packing::pack_nibbles(q, row + b * (kQuantBlock / 2));
      quant_packing::pack_high_bits(q, high + b * 8);
      store_f16(scales + 2 * b, dh);
    }
    return;
  }
  uint8_t* mins = row + quant_mins_offset(format, cols);
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kQuantBlock;
    const auto [d, m] = choose_asymmetric_scale(xb, kQuantBlock, 15);
    const uint16_t dh = f32_to_f16(d), mh = f32_to_f16(m);  // exact: f16 values
    uint8_t q[kQuantBlock];
    for (int j = 0; j < kQuantBlock; ++j) {
      const float v = d == 0.0f ? 0.0f : std::nearbyint((xb[j] - m) / d);
      q[j] = static_cast<uint8_t>(std::clamp(v, 0.0f, 15.0f));
    }
    quant_packing::pack_nibbles(q, row + b * (kQuantBlock / 2));
    store_f16(scales + 2 * b, dh);
    store_f16(mins + 2 * b, mh);
  }
}

void dequantize_row(DType format, const uint8_t* row, int64_t cols, float* out) {
  check_cols(format, cols);
  if (format == DType::Q4_K256) return dequantize_q4k_row(row, cols, out);
  if (format == DType::Q6_K256) return dequantize_q6k_row(row, cols, out);
  const int64_t blocks = cols / kQuantBlock;
  const uint8_t* scales = row + quant_scales_offset(format, cols);
  if (format == DType::Q8_B32) {
    const auto* q = reinterpret_cast<const int8_t*>(row);
    for (int64_t b = 0; b < blocks; ++b) {
      const float d = f16_to_f32(load_f16(scales + 2 * b));
      for (int j = 0; j < kQuantBlock; ++j)
        out[b * kQuantBlock + j] = d * static_cast<float>(q[b * kQuantBlock + j]);
    }
    return;
  }
  if (format == DType::Q6_B32) {
    const uint8_t* high = row + quant_highs_offset(format, cols);
    for (int64_t b = 0; b < blocks; ++b) {
      const float d = f16_to_f32(load_f16(scales + 2 * b));
      for (int j = 0; j < kQuantBlock; ++j) {
        const int q = quant_packing::code6(row + b * (kQuantBlock / 2), high + b * 8, j);
        out[b * kQuantBlock + j] = d * static_cast<float>(q - 32);
      }
    }
    return;
  }
  const uint8_t* mins = row + quant_mins_offset(format, cols);
  for (int64_t b = 0; b < blocks; ++b) {
    const float d = f16_to_f32(load_f16(scales + 2 * b));
    const float m = f16_to_f32(load_f16(mins + 2 * b));
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      const uint8_t byte = row[b * (kQuantBlock / 2) + j];
      out[b * kQuantBlock + j] = d * static_cast<float>(byte & 0x0f) + m;
      out[b * kQuantBlock + j + 16] = d * static_cast<float>(byte >> 4) + m;
    }
  }
}

Tensor quantize_matrix(const Tensor& w, DType format) {
  ATTNRES_CHECK(w.device == Device::CPU && w.rank() == 2 &&
                    (w.dtype == DType::F32 || w.dtype == DType::BF16 || w.dtype == DType::F16),
                "quantize_matrix takes a host [rows, cols] float matrix, got " +
                    shape_str(w.shape) + " " + std::string(dtype_name(w.dtype)));
  const int64_t rows = w.dim(0), cols = w.dim(1);
  Tensor q = Tensor::empty({rows, cols}, format);
  const size_t row_bytes = quant_row_bytes(format, cols);
  std::vector<float> x(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < cols; ++k) x[k] = element_as_float(w, r * cols + k);
    quantize_row(format, x.data(), cols, q.ptr<uint8_t>() + r * row_bytes);
  }
  return q;
}

Tensor dequantize_matrix(const Tensor& q) {
  ATTNRES_CHECK(q.device == Device::CPU && q.rank() == 2 && is_block_quantized(q.dtype),
                "dequantize_matrix takes a host block-quantized [rows, cols] matrix");
  const int64_t rows = q.dim(0), cols = q.dim(1);
  Tensor out = Tensor::empty({rows, cols}, DType::F32);
  const size_t row_bytes = quant_row_bytes(q.dtype, cols);
  for (int64_t r = 0; r < rows; ++r)
    dequantize_row(q.dtype, q.ptr<const uint8_t>() + r * row_bytes, cols,
                   out.ptr<float>() + r * cols);
  return out;
}

std::string quant_format_name(DType format) {
  switch (format) {
    case DType::Q8_B32:
      return "int8";
    case DType::Q6_B32:
      return "int6";
    case DType::Q4_B32:
      return "int4";
    case DType::Q6_K256:
      return "int6k";
    case DType::Q4_K256:
      return "int4k";
    default:
      ATTNRES_CHECK(false, std::string(dtype_name(format)) + " is not a quantized format");
  }
  return "";
}

DType quant_tensor_format_from_name(const std::string& name, std::string_view what) {
  if (name == "int8") return DType::Q8_B32;
  if (name == "int6") return DType::Q6_B32;
  if (name == "int4") return DType::Q4_B32;
  if (name == "int6k") return DType::Q6_K256;
  if (name == "int4k") return DType::Q4_K256;
  throw Error(std::string(what) + " '" + name + "': expected int8, int6, int4, int6k or int4k");
}

DType quant_format_from_name(const std::string& name, std::string_view what) {
  if (name == "int8") return DType::Q8_B32;
  if (name == "int4") return DType::Q4_B32;
  throw Error(std::string(what) + " '" + name + "': expected int8 or int4");
}

MatrixRole matrix_role(std::string_view name, int num_layers) {
  if (name == "model.embed_tokens.weight" || name == "lm_head.weight")
    return MatrixRole::EmbeddingOrHead;
  constexpr std::string_view kLayers = "model.layers.";
  if (name.substr(0, kLayers.size()) != kLayers) return MatrixRole::Projection;
  const std::string_view rest = name.substr(kLayers.size());
  const size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0) return MatrixRole::Projection;
  int layer = 0;
  for (const char c : rest.substr(0, dot)) {
    if (c < '0' || c > '9') return MatrixRole::Projection;
    layer = layer * 10 + (c - '0');
  }
  const std::string_view proj = rest.substr(dot + 1);
  if (proj != "self_attn.v_proj.weight" && proj != "mlp.down_proj.weight")
    return MatrixRole::Projection;
  const int n = num_layers;
  const bool more_bits = layer < n / 8 || layer >= 7 * n / 8 || (layer - n / 8) % 3 == 2;
  return more_bits ? MatrixRole::SensitiveProjection : MatrixRole::Projection;
}

DType recipe_matrix_format(DType recipe, MatrixRole role, int64_t cols) {
  ATTNRES_CHECK(recipe == DType::Q8_B32 || recipe == DType::Q4_B32,
                std::string(dtype_name(recipe)) + " is not a quantization recipe");
  if (recipe == DType::Q8_B32) return recipe;
  const bool super_blocks = cols % kQuantSuperBlock == 0;
  if (role == MatrixRole::Projection) return super_blocks ? DType::Q4_K256 : DType::Q4_B32;
  return super_blocks ? DType::Q6_K256 : DType::Q6_B32;
}

std::vector<DType> recipe_formats(DType recipe) {
  if (recipe == DType::Q8_B32) return {recipe};
  ATTNRES_CHECK(recipe == DType::Q4_B32,
                std::string(dtype_name(recipe)) + " is not a quantization recipe");
  return {DType::Q4_K256, DType::Q6_K256, DType::Q4_B32, DType::Q6_B32};
}

}  // namespace attnres
