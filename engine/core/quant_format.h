// The block-quantized weight formats (DType::Q8_B32, DType::Q4_B32) as stored in memory and in
// our quantized checkpoints: the one definition every quantizer, loader and kernel reads.
//
// A [rows, cols] matrix (cols a multiple of 32) is stored row by row; row r is cols / 32 blocks
// of 32 consecutive weights, laid out as whole-row arrays so a kernel streams each one:
//
//   Q8_B32 (8.5 bits per weight, symmetric):
//     int8  q[cols]            w[k] = d[k / 32] * q[k],  q in [-127, 127]
//     f16   d[cols / 32]
//   Q4_B32 (5 bits per weight, asymmetric):
//     uint8 packed[cols / 2]   block b is bytes [16 b, 16 b + 16): byte 16 b + j holds
//                              q[32 b + j] in its low nibble and q[32 b + j + 16] in its high
//                              one (llama.cpp's Q4 order: one 16-byte load, two 16-lane halves)
//     f16   d[cols / 32]       w[k] = d[k / 32] * q[k] + m[k / 32],  q in [0, 15]
//     f16   m[cols / 32]
//
// Dequantization is exact in f32 (a product of an f16 and a small integer, plus an f16), so a
// reference may dequantize and compute in f32 or wider.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"

namespace attnres {

constexpr int64_t kQuantBlock = 32;

// Bytes of one stored row of `cols` weights; throws unless cols is a positive multiple of 32.
size_t quant_row_bytes(DType format, int64_t cols);
// Offsets inside a row of the f16 scales and (Q4_B32) the f16 mins.
size_t quant_scales_offset(DType format, int64_t cols);
size_t quant_mins_offset(DType format, int64_t cols);

// One row: x [cols] -> row [quant_row_bytes]. Each block's scale (and min) is the f16 value
// among a small set of candidates, the absmax / min-max choice first, whose weights read back
// closest to x in squared error (engine/core/quant_search.h: the candidates, the error, ties);
// q is then the nearest integer, ties to even, against the f16 scale (and min):
//   Q8_B32: d = choose_symmetric_scale(block, 32, 127), q = clamp(round(x / d), -127, 127)
//           (d == 0: q = 0)
//   Q4_B32: (d, m) = choose_asymmetric_scale(block, 32, 15),
//           q = clamp(round((x - m) / d), 0, 15) (d == 0: q = 0)
// Throws on a non-finite weight or an absmax / min-max scale (or min) f16 cannot hold.
void quantize_row(DType format, const float* x, int64_t cols, uint8_t* row);
// row -> out [cols] f32, exactly.
void dequantize_row(DType format, const uint8_t* row, int64_t cols, float* out);

// A host [rows, cols] F32 / BF16 / F16 matrix quantized into a new host tensor of `format`.
Tensor quantize_matrix(const Tensor& w, DType format);
// A host block-quantized matrix widened to a new F32 one (tests, references).
Tensor dequantize_matrix(const Tensor& q);

// The user-facing names (--quantization, checkpoints' quantization_config): "int8" <->
// Q8_B32, "int4" <-> Q4_B32. from_name throws, naming `what`, on anything else.
std::string quant_format_name(DType format);
DType quant_format_from_name(const std::string& name, std::string_view what);

}  // namespace attnres
