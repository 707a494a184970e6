// The quantized linear (cpu_linear_quant.h) over Q6_B32 weights (engine/core/quant_format.h),
// w = dw (q - 32) with q in [0, 63]: each block's integer sum is
//   I_b = sum_j (q_j - 32) qx_j = sum_j q_j qx_j - 32 sum_j qx_j   (exact, |I_b| < 2^17)
// and each output's arithmetic is Q8_B32's chain: acc = fma(f32(I_b), f32(dw_b dx_b), acc) per
// block in order, then + bias. The unsigned q times the signed qx is Q4_B32's product with
// 6-bit weights; the activation row (QuantizedRows) holds q[K] (int8), f32 dx[K / 32], then
// int32 c[K / 32] = 32 sum_j qx_j, subtracted from each block's sum.
#pragma once

#include <cstdint>

#include "kernels/cpu/cpu_linear_quant.h"
#include "kernels/cpu/worker_pool.h"

namespace attnres::cpu {

// out [x.rows, n] = x (quantized for Q6_B32) times w [n, x.k] (+ bias [n] when not null).
void linear_q6(const QuantizedRows& x, const uint8_t* w, int64_t n, const float* bias, float* out,
               WorkerPool& pool);

}  // namespace attnres::cpu
