// The PreNorm's arithmetic, element by element and thread by thread, shared by the kernels
// that write the normed rows (rms_norm_kernel, depth_phase2_prenorm_kernel) and the GEMV that
// computes them in its prologue instead (cuda_gemv_prenorm.cu), so both get the same bits.
//
// The standalone kernels run one block of B = row_block_threads(n) threads per row; thread v
// accumulates elements i = v, v + B, v + 2B, ... in that order, then block_sum / block_sum_n
// reduce: warp_sum over each warp's 32 threads, then warp_sum over the B / 32 warp totals. The
// GEMV's block has 8 warps whatever n is: its warps play the B / 32 "virtual" warps of that
// block in turn (virtual thread v = 32 * virtual warp + lane), which gives every partial
// sum the same operands in the same order, so the totals are equal bit for bit.
// Multiply-adds are explicit (__fmaf_rn / __fmul_rn): contraction is then not the compiler's
// choice, which could differ between the two kernels' contexts.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_common.cuh"

namespace attnres::cuda {

// Virtual thread v's sum of squares over x [n] in a block of B threads.
__device__ __forceinline__ float prenorm_sum_squares(const float* x, int64_t n, int v, int B) {
  float ss = 0.0f;
  for (int64_t i = v; i < n; i += B) ss = __fmaf_rn(x[i], x[i], ss);
  return ss;
}

// 1 / rms from a row's total sum of squares.
__device__ __forceinline__ float prenorm_inv_rms(float sum_squares, int64_t n, float eps) {
  return 1.0f / sqrtf(sum_squares / static_cast<float>(n) + eps);
}

// One normed element: x * inv_rms * gain (two roundings, in that order).
__device__ __forceinline__ float prenorm_scale(float x, float inv_rms, float gain) {
  return __fmul_rn(__fmul_rn(x, inv_rms), gain);
}

// Virtual thread v's share of the partial's logit in the plain Phase-2 merge: query . p and
// p . p over its elements.
__device__ __forceinline__ void phase2_logit_partials(const float* query, const float* p, int64_t d,
                                                      int v, int B, float& dot,
                                                      float& sum_squares) {
  dot = sum_squares = 0.0f;
  for (int64_t i = v; i < d; i += B) {
    dot = __fmaf_rn(query[i], p[i], dot);
    sum_squares = __fmaf_rn(p[i], p[i], sum_squares);
  }
}

// The plain Phase-2 merge's weights of o and p (Backend::depth_phase2_prenorm without the
// §2d switches): logit q = dot / rms(p) + bias; M = max(m, q); a = e^(m - M), b = e^(q - M);
// h = (a o + b p) / (a s + b) = wa o + wb p.
struct Phase2Weights {
  float wa, wb;
};
__device__ __forceinline__ Phase2Weights phase2_weights(float dot, float sum_squares, int64_t d,
                                                        float mix_eps, float bias, float m,
                                                        float s) {
  const float q = dot / sqrtf(sum_squares / static_cast<float>(d) + mix_eps) + bias;
  const float big = fmaxf(m, q);
  const float a = expf(m - big), b = expf(q - big);
  const float inv_den = 1.0f / __fmaf_rn(a, s, b);
  return {__fmul_rn(a, inv_den), __fmul_rn(b, inv_den)};
}

// One element of the merged row h = wa o + wb p.
__device__ __forceinline__ float phase2_mix(const Phase2Weights& w, float o, float p) {
  return __fmaf_rn(w.wa, o, __fmul_rn(w.wb, p));
}

}  // namespace attnres::cuda
