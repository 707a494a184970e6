// The block-quantized weight formats (DType::Q8_B32, Q6_B32, Q4_B32) as stored in memory and
// in our quantized checkpoints: the one definition every quantizer, loader and kernel reads.
//
// A [rows, cols] matrix (cols a multiple of 32) is stored row by row; row r is cols / 32 blocks
// of 32 consecutive weights, laid out as whole-row arrays so a kernel streams each one:
//
//   Q8_B32 (8.5 bits per weight, symmetric):
//     int8  q[cols]            w[k] = d[k / 32] * q[k],  q in [-127, 127]
//     f16   d[cols / 32]
//   Q6_B32 (6.5 bits per weight, symmetric):
//     uint8 low[cols / 2]      the low 4 bits of q, in Q4_B32's order (below)
//     uint8 high[cols / 4]     block b is bytes [8 b, 8 b + 8): byte 8 b + j holds the top 2 bits
//                              of q[32 b + j + 8 i] in its bits 2 i, 2 i + 1 (i = 0..3)
//     f16   d[cols / 32]       w[k] = d[k / 32] * (q[k] - 32),  q in [1, 63]
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
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"

namespace attnres {

constexpr int64_t kQuantBlock = 32;

// Bytes of one stored row of `cols` weights; throws unless cols is a positive multiple of 32.
size_t quant_row_bytes(DType format, int64_t cols);
// Offsets inside a row of the f16 scales, (Q4_B32) the f16 mins and (Q6_B32) the high bits.
size_t quant_scales_offset(DType format, int64_t cols);
size_t quant_mins_offset(DType format, int64_t cols);
size_t quant_highs_offset(DType format, int64_t cols);

// One row: x [cols] -> row [quant_row_bytes]. Each block's scale (and min) is the f16 value
// among a small set of candidates, the absmax / min-max choice first, whose weights read back
// closest to x in squared error (engine/core/quant_search.h: the candidates, the error, ties);
// q is then the nearest integer, ties to even, against the f16 scale (and min):
//   Q8_B32: d = choose_symmetric_scale(block, 32, 127), q = clamp(round(x / d), -127, 127)
//           (d == 0: q = 0)
//   Q6_B32: d = choose_symmetric_scale(block, 32, 31), q = 32 + clamp(round(x / d), -31, 31)
//           (d == 0: q = 32)
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

// The formats' names in checkpoints' per-tensor metadata: "int8" <-> Q8_B32, "int6" <->
// Q6_B32, "int4" <-> Q4_B32. from_name throws, naming `what`, on anything else.
std::string quant_format_name(DType format);
DType quant_tensor_format_from_name(const std::string& name, std::string_view what);

// The recipes --quantization and quantization_config.format name, each a DType standing for
// the set of formats it uses: "int8" (Q8_B32) puts every matrix in Q8_B32; "int4" (Q4_B32)
// puts the layers' projections in Q4_B32 and the embedding and the LM head (tied or not) in
// Q6_B32, as llama.cpp's Q4_K_M keeps its output matrix at 6 bits: that matrix's error reaches
// every logit directly. from_name throws, naming `what`, on anything but int8 and int4.
DType quant_format_from_name(const std::string& name, std::string_view what);
//
// Within the layers, "int4" also keeps v_proj and down_proj at Q6_B32 in the first eighth of
// the layers, the last eighth, and every third layer between (layer i of n where
// i < n / 8 || i >= 7 n / 8 || (i - n / 8) % 3 == 2, integer division): the layers and
// projections llama.cpp's Q4_K_M keeps at 6 bits (its `use_more_bits`), so that the two
// recipes spend their extra bits on the same matrices.
enum class MatrixRole { Projection, SensitiveProjection, EmbeddingOrHead };
// The role of the weight matrix `name` (a checkpoint name ending in ".weight") in a model of
// `num_layers` layers.
MatrixRole matrix_role(std::string_view name, int num_layers);
DType recipe_matrix_format(DType recipe, MatrixRole role);
// Every format the recipe uses (what a backend must read to run it).
std::vector<DType> recipe_formats(DType recipe);

}  // namespace attnres
