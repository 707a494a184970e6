// The quantized linear (cpu_linear_quant.h) over Q6_B32 weights (engine/core/quant_format.h),
// w = dw (q - 32) with q in [0, 63]: each block's integer sum is
//   I_b = sum_j (q_j - 32) qx_j = sum_j q_j qx_j - 32 sum_j qx_j   (exact, |I_b| < 2^17)
// and each output's arithmetic is Q8_B32's chain: acc = fma(f32(I_b), f32(dw_b dx_b), acc) per
// block in order, then + bias. The unsigned q times the signed qx is Q4_B32's product with
// 6-bit weights; the activation row (QuantizedRows) holds q[K] (int8), f32 dx[K / 32], then
// int32 c[K / 32] = 32 sum_j qx_j, subtracted from each block's sum.
//
// Q6_K256 (w = f32(d_s sc_i) (q - 32), d_s the f16 scale of the super-block of 256, sc_i the
// u8 scale of the sub-block i of 16 weights) keeps the activation blocks of 32: block b holds
// sub-blocks 2 b (its weights 0..15: the low nibbles of its 16 low bytes) and 2 b + 1 (16..31:
// the high nibbles), and its exact integer sum applies both integer scales:
//   I_b = sc_2b (sum_{t<16} q_t qx_t - 32 sum_{t<16} qx_t)
//       + sc_2b+1 (sum_{16<=t<32} q_t qx_t - 32 sum_{16<=t<32} qx_t)   (int32, |I_b| < 2^25)
// and each output's chain is acc = fma(f32(I_b), f32(d_s dx_b), acc) per block in order (d_s of
// the block's super-block, as f32), then + bias. f32(I_b) rounds where |I_b| > 2^24: that
// rounding is part of the definition, the same in every path. Its activation row holds q[K]
// (int8), f32 dx[K / 32], then int32 c[K / 16] = 32 sum_t qx_t over each sub-block of 16.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_linear_quant.h"
#include "kernels/cpu/worker_pool.h"

namespace attnres::cpu {

// out [x.rows, n] = x (quantized for Q6_B32) times w [n, x.k] (+ bias [n] when not null).
void linear_q6(const QuantizedRows& x, const uint8_t* w, int64_t n, const float* bias, float* out,
               WorkerPool& pool);

// The same over Q6_K256 weights (cpu_linear_q6k.cpp), x quantized for Q6_K256.
void linear_q6k(const QuantizedRows& x, const uint8_t* w, int64_t n, const float* bias, float* out,
                WorkerPool& pool);

}  // namespace attnres::cpu
