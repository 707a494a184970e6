// linear over block-quantized weights (DType::Q8_B32 / Q6_B32 / Q4_B32 / Q4_K256,
// quant_format.h): out[r, o] = sum_k x[r, k] * w[o, k] (+ bias[o]), x [R, K] f32, out [R, N] f32.
//
// The activations are quantized too, per row and per block of 32 (as llama.cpp's Q8_0):
//   dx = f32(max |x| / 127), qx = clamp(nearbyint(x / dx), -127, 127)   (dx == 0: qx = 0)
// so that each block's dot product is an exact integer sum: Q8_B32
//   sum_b dw_b dx_b (sum_j qw_j qx_j)
// and Q4_B32 (w = dw q + m) adds each block's min term m_b (dx_b sum_j qx_j); Q6_B32
// (w = dw (q - 32)) is Q8_B32's (cpu_linear_q6.h), and Q6_K256's integer sub-block scales
// enter I_b, its f16 super-block scale the place of dw_b (cpu_linear_q6.h).
// Q4_K256 (w = D q - M per block, quant_format.h) is Q4_B32's arithmetic with dw_b = D and
// m_b = -M (both exact f32 products of the super-block's f16 d / dmin and the block's 6-bit
// sc / mn, q4k_block_params) and Q4_B32's activation rows.
// Each output's arithmetic is fixed, the same in every build and for any number of rows:
//   acc = 0
//   for each block b, in order:
//     acc = fma(f32(I_b), f32(dw_b * dx_b), acc)        I_b = the block's exact integer sum
//     Q4_B32, Q4_K256: acc = fma(m_b, f32(dx_b * sum_j qx_j), acc)
//   out = acc (+ bias)
// The integer sums run on the widest integer dot product the build targets (AVX-512 VNNI
// vpdpbusd, else AVX2 vpmaddubsw, else scalar code); the float steps are the ones above with
// one output per lane. So a row gives the same bits alone or in any batch (batch invariance),
// in the GEMV (R <= 8: weights streamed as stored) and the GEMM (R > 8: weight tiles packed
// once and reused across rows) alike.
#pragma once

#include <cstdint>

#include "engine/core/dtype.h"
#include "kernels/cpu/worker_pool.h"

namespace attnres::cpu {

// The activation quantization of one block of 32: writes q[32], returns dx (as above). A
// block holding a NaN or an infinity gets dx = NaN (and q = 0), so that every output it
// feeds is NaN.
float quantize_activation_block(const float* x, int8_t* q);

// x rows quantized for weights of `format`, in the layout that build's kernel reads; they
// live in the calling thread's scratch (ScratchSlot::QuantInput) until it quantizes again.
struct QuantizedRows {
  DType format = DType::Q8_B32;
  int64_t rows = 0, k = 0;
  int64_t row_bytes = 0;  // bytes per quantized row
  const uint8_t* data = nullptr;
};
QuantizedRows quantize_rows(DType format, const float* x, int64_t rows, int64_t k,
                            WorkerPool& pool);

// out [rows, n] = the quantized rows times w [n, k] (rows of quant_row_bytes(format, k)), plus
// bias [n] when not null.
void linear_quantized(const QuantizedRows& x, const uint8_t* w, int64_t n, const float* bias,
                      float* out, WorkerPool& pool);

// out[t] = the dequantized row ids[t] of a [vocab, d] table of `format` (exact).
void embed_quantized(DType format, const uint8_t* table, int64_t d, const int32_t* ids,
                     int64_t t_dim, float* out, WorkerPool& pool);

// The kernel's name for this build ("avx512-vnni", "avx2", "scalar").
const char* quantized_linear_isa();

}  // namespace attnres::cpu
