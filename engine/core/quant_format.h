// The block-quantized weight formats (DType::Q8_B32, Q6_B32, Q4_B32, Q6_K256, Q4_K256) as
// stored in memory and in our quantized checkpoints: the one definition every quantizer,
// loader and kernel reads.
//
// A [rows, cols] matrix is stored row by row (cols a multiple of 32; K256: of 256); row r is
// cols / 32 blocks of 32 consecutive weights, laid out as whole-row arrays so a kernel streams
// each one:
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
// The K256 formats group the blocks into super-blocks of 256 weights whose per-block scales
// are small integers under one f16 scale per super-block (llama.cpp's k-quants' structure):
//   Q4_K256 (4.5 bits per weight, asymmetric):
//     uint8 packed[cols / 2]   Q4_B32's
//     uint8 params[cols / 16]  super-block s is bytes [16 s, 16 s + 16): f16 d, f16 dmin, then
//                              for block j (0..7) of the super-block byte 4 + j holds sc_j in
//                              bits 0..5 and bits 4..5 of mn_j in bits 6..7, and byte 12 + i
//                              (i = 0..3) holds bits 0..3 of mn_i (low nibble) and of mn_{i+4}
//                              (high nibble); sc_j, mn_j in [0, 63]
//     w[32 (8 s + j) + t] = f32(D q - M),  D = d sc_j, M = dmin mn_j (both exact in f32),
//     q in [0, 15]: the Q4_B32 arithmetic with block scale D and block min -M.
//   Q6_K256 (6.5625 bits per weight, symmetric, scales per 16 weights):
//     uint8 low[cols / 2], high[cols / 4]   Q6_B32's
//     uint8 sc[cols / 16]      sc[i] scales weights [16 i, 16 i + 16)
//     f16   d[cols / 256]      w[k] = f32(d[k / 256] sc[k / 16]) * (q[k] - 32),  q in [1, 63]
//                              (exact: 11 + 8 + 5 significant bits)
//
// Dequantization is exact in f32 except Q4_K256's one rounding of D q - M, so a reference
// may dequantize and compute in f32 or wider.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"

namespace attnres {

constexpr int64_t kQuantBlock = 32;
constexpr int64_t kQuantSuperBlock = 256;

// The multiple a row's length must be: 32, or 256 for the K256 formats.
int64_t quant_row_multiple(DType format);
// Bytes of one stored row of `cols` weights; throws unless cols is a positive multiple of
// quant_row_multiple(format).
size_t quant_row_bytes(DType format, int64_t cols);
// Offsets inside a row: of the f16 scales (B32 formats), Q4_K256's super-block params,
// Q6_K256's u8 scales; (Q4_B32) the f16 mins; (Q6_B32, Q6_K256) the high bits; (Q6_K256) the
// f16 super-block scales.
size_t quant_scales_offset(DType format, int64_t cols);
size_t quant_mins_offset(DType format, int64_t cols);
size_t quant_highs_offset(DType format, int64_t cols);
size_t quant_super_scales_offset(DType format, int64_t cols);

// Q4_K256's block j (0..7) of a super-block's 16 param bytes: D and -M as f32 (exact).
struct BlockScaleMin {
  float d;
  float m;
};
BlockScaleMin q4k_block_params(const uint8_t* params, int j);

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
// The K256 formats start from those choices and refine them (the scales as stored):
//   Q4_K256, per super-block: (d_j, m_j) = choose_asymmetric_scale(block j, 32, 15),
//           M_j = -m_j where m_j < 0, else +0; a block with m_j > 0 (the format subtracts a
//           min >= 0) takes d_j = f16(max x / 15) (f32 division) instead;
//           d = f16(max_j d_j / 63), dmin = f16(max_j M_j / 63) (f32 division);
//           sc_j = clamp(nearbyint(d_j / d), 0, 63), mn_j = clamp(nearbyint(M_j / dmin), 0, 63)
//           (0 where d, dmin == 0); then two passes over the blocks j = 0..7 in order, each
//           trying for field in (sc_j, mn_j), for delta in (-1, +1, -2, +2) the field's value
//           left by the tries before + delta (skipped outside [0, 63]), kept when its asymmetric_error(block, 32, 15,
//           D, -M) is strictly smaller than the best so far; q = clamp(nearbyint((x + M) / D), 0,
//           15) (D == 0: q = 0).
//   Q6_K256, per super-block: s_i = choose_symmetric_scale(weights [16 i, 16 i + 16), 16, 31)
//           for its 16 sub-blocks, d = f16(max_i s_i / 255), sc_i = clamp(nearbyint(s_i / d),
//           0, 255) (0 where d == 0); then two passes over i = 0..15, each trying sc_i's value
//           left by the tries before + delta for delta in (-1, +1, -2, +2) (skipped outside [0, 255]), kept when its
//           symmetric_error(sub-block, 16, 31, D = d sc_i) is strictly smaller;
//           q = 32 + clamp(nearbyint(x / D), -31, 31) (D == 0: q = 32).
// Throws on a non-finite weight or an absmax / min-max scale (or min) f16 cannot hold.
void quantize_row(DType format, const float* x, int64_t cols, uint8_t* row);
// row -> out [cols] f32, exactly.
void dequantize_row(DType format, const uint8_t* row, int64_t cols, float* out);

// A host [rows, cols] F32 / BF16 / F16 matrix quantized into a new host tensor of `format`.
Tensor quantize_matrix(const Tensor& w, DType format);
// A host block-quantized matrix widened to a new F32 one (tests, references).
Tensor dequantize_matrix(const Tensor& q);

// The formats' names in checkpoints' per-tensor metadata: "int8" <-> Q8_B32, "int6" <->
// Q6_B32, "int4" <-> Q4_B32, "int6k" <-> Q6_K256, "int4k" <-> Q4_K256. from_name throws,
// naming `what`, on anything else.
std::string quant_format_name(DType format);
DType quant_tensor_format_from_name(const std::string& name, std::string_view what);

// The recipes --quantization and quantization_config.format name, each a DType standing for
// the set of formats it uses: "int8" (Q8_B32) puts every matrix in Q8_B32; "int4" (Q4_B32)
// puts the layers' projections in Q4_K256 and the embedding and the LM head (tied or not) in
// Q6_K256, as llama.cpp's Q4_K_M keeps its output matrix at 6 bits: that matrix's error reaches
// every logit directly. A matrix whose rows are not a multiple of 256 long takes the B32
// format of the same bits instead (Q4_B32, Q6_B32). from_name throws, naming `what`, on
// anything but int8 and int4.
DType quant_format_from_name(const std::string& name, std::string_view what);
//
// Within the layers, "int4" also keeps v_proj and down_proj at 6 bits in the first eighth of
// the layers, the last eighth, and every third layer between (layer i of n where
// i < n / 8 || i >= 7 n / 8 || (i - n / 8) % 3 == 2, integer division): the layers and
// projections llama.cpp's Q4_K_M keeps at 6 bits (its `use_more_bits`), so that the two
// recipes spend their extra bits on the same matrices.
enum class MatrixRole { Projection, SensitiveProjection, EmbeddingOrHead };
// The role of the weight matrix `name` (a checkpoint name ending in ".weight") in a model of
// `num_layers` layers.
MatrixRole matrix_role(std::string_view name, int num_layers);
// The format of a matrix of that role with rows `cols` long.
DType recipe_matrix_format(DType recipe, MatrixRole role, int64_t cols);
// Every format the recipe uses (what a backend must read to run it).
std::vector<DType> recipe_formats(DType recipe);

}  // namespace attnres
