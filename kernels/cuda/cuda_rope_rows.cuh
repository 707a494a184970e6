// The per-head arithmetic of qk_norm_rope (Qwen3's q_norm / k_norm, then the rotate-half RoPE)
// and of the KV cache store, shared by the kernels that do it: qk_norm_rope_kernel
// (cuda_norm_rope.cu, its own launch) and the QKV GEMV's epilogue (cuda_gemv_rope.cu), so q, k
// and the cache hold the same bits either way.
// - rope_cos_sin: one entry of a token's cos / sin table, the angle position * inv_freq formed
//   in double as the CPU reference forms it (long contexts stay accurate), rounded to f32.
// - norm_rope_head: one warp's head of hd values. Lane j sums the squares of elements j,
//   j + 32, ... in that order, then warp_sum; then lane j owns the pairs (i, i + hd / 2) for
//   i = j, j + 32, ...: it reads both, writes both (and their cache copies), so in may be out.
// Multiply-adds are explicit (__fmaf_rn / __fmul_rn): contraction is then not the compiler's
// choice, which could differ between the two kernels' contexts.
#pragma once

#include <cstdint>

#include "kernels/cuda/cuda_bf16_round.h"
#include "kernels/cuda/cuda_common.cuh"

namespace attnres::cuda {

__device__ __forceinline__ void rope_cos_sin(int32_t position, float inv_freq, float& cos_out,
                                             float& sin_out) {
  const double angle = static_cast<double>(position) * static_cast<double>(inv_freq);
  double s, c;
  sincos(angle, &s, &c);
  cos_out = static_cast<float>(c);
  sin_out = static_cast<float>(s);
}

// A value into a cache row, as store_kv converts it (bf16: cuda_bf16_round.h's rounding, the
// CPU's f32_to_bf16 bit for bit; S = uint16_t holds the bf16 bits).
__device__ __forceinline__ void store_cached(float* dst, float x) { *dst = x; }
__device__ __forceinline__ void store_cached(uint16_t* dst, float x) {
  *dst = round_to_bf16_bits(x);
}

// One warp: out = rope(norm(in)) for a head of hd values (norm only with a gain [hd]), and the
// result also into cached [hd] when it is not null.
template <class S>
__device__ __forceinline__ void norm_rope_head(const float* in, float* out, S* cached, int hd,
                                               const void* gain, DType gain_dtype, float eps,
                                               const float* cos_t, const float* sin_t, int lane) {
  const int half = hd / 2;
  float inv_rms = 1.0f;
  if (gain) {
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) ss = __fmaf_rn(in[i], in[i], ss);
    ss = warp_sum(ss);  // every lane's loads are done before any lane stores below
    inv_rms = 1.0f / sqrtf(ss / static_cast<float>(hd) + eps);
  }
  for (int i = lane; i < half; i += 32) {
    float a = in[i], b = in[i + half];
    if (gain) {
      a = __fmul_rn(__fmul_rn(a, inv_rms), load_float(gain, gain_dtype, i));
      b = __fmul_rn(__fmul_rn(b, inv_rms), load_float(gain, gain_dtype, i + half));
    }
    const float lo = __fmaf_rn(a, cos_t[i], -__fmul_rn(b, sin_t[i]));
    const float hi = __fmaf_rn(b, cos_t[i], __fmul_rn(a, sin_t[i]));
    out[i] = lo;
    out[i + half] = hi;
    if (cached) {
      store_cached(cached + i, lo);
      store_cached(cached + i + half, hi);
    }
  }
}

}  // namespace attnres::cuda
