// The decode GEMVs' PreNorm prologue (cuda_gemv_prenorm.cu, cuda_gemv_rope.cu): every block
// computes the R normed rows it multiplies into shared memory, from the partial (and, for the
// plain Phase-2 merge, the sublayer's Phase-1 row o and its m, s), with the standalone PreNorm
// kernels' arithmetic in their order (cuda_prenorm_rows.cuh), so the rows are bit for bit the
// ones rms_norm_kernel / depth_phase2_prenorm_kernel write.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_gemv_rows.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_prenorm_rows.cuh"

namespace attnres::cuda {

// x[r, :] = the PreNorm of row r (r < R), in shared memory; every thread of the block calls it.
// B: the standalone PreNorm kernel's block size for rows of K (row_block_threads(K)).
template <int R>
__device__ void prenorm_rows(const GemvPrenorm& p, int64_t K, int B, float* x) {
  __shared__ float partials[2][kMaxGemvRows][32];  // per row, per virtual warp
  __shared__ Phase2Weights weights[kMaxGemvRows];
  __shared__ float inv_rms[kMaxGemvRows];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int virtual_warps = B / 32;
  const int tasks = R * virtual_warps;  // (row, virtual warp) pairs
  const bool mix = p.m != nullptr;

  if (mix) {  // the partial's logit: query . p and p . p, as block_sum_n<2> reduces them
    for (int task = warp; task < tasks; task += kGemvWarps) {
      const int r = task / virtual_warps, vw = task % virtual_warps;
      float dot, sum_squares;
      phase2_logit_partials(p.query, p.partial + r * K, K, vw * 32 + lane, B, dot, sum_squares);
      dot = warp_sum(dot);
      sum_squares = warp_sum(sum_squares);
      if (lane == 0) {
        partials[0][r][vw] = dot;
        partials[1][r][vw] = sum_squares;
      }
    }
    __syncthreads();
    if (warp < R) {
      const float dot = warp_sum(lane < virtual_warps ? partials[0][warp][lane] : 0.0f);
      const float sum_squares = warp_sum(lane < virtual_warps ? partials[1][warp][lane] : 0.0f);
      if (lane == 0) {
        weights[warp] =
            phase2_weights(dot, sum_squares, K, p.mix_eps, p.bias, p.m[warp], p.s[warp]);
      }
    }
    __syncthreads();
  }
  // The sum of squares of h (mix: h = wa o + wb p, written to x as it goes; plain: h = p).
  for (int task = warp; task < tasks; task += kGemvWarps) {
    const int r = task / virtual_warps, vw = task % virtual_warps;
    const int v = vw * 32 + lane;
    const float* pr = p.partial + r * K;
    float sum_squares = 0.0f;
    if (mix) {
      const Phase2Weights w = weights[r];
      const float* orow = p.o + r * K;
      for (int64_t i = v; i < K; i += B) {
        const float h = phase2_mix(w, orow[i], pr[i]);
        x[r * K + i] = h;
        sum_squares = __fmaf_rn(h, h, sum_squares);
      }
    } else {
      sum_squares = prenorm_sum_squares(pr, K, v, B);
    }
    sum_squares = warp_sum(sum_squares);
    if (lane == 0) partials[0][r][vw] = sum_squares;
  }
  __syncthreads();
  if (warp < R) {
    const float total = warp_sum(lane < virtual_warps ? partials[0][warp][lane] : 0.0f);
    if (lane == 0) inv_rms[warp] = prenorm_inv_rms(total, K, p.eps);
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float* h = mix ? x + r * K : p.partial + r * K;
    for (int64_t i = threadIdx.x; i < K; i += blockDim.x)
      x[r * K + i] = prenorm_scale(h[i], inv_rms[r], load_float(p.gain, p.gain_dtype, i));
  }
  __syncthreads();
}

}  // namespace attnres::cuda
