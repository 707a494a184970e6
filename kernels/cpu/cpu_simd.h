// A tiny SIMD vocabulary shared by the CPU kernels: one "vector of f32" type VecF with
// kLanes lanes (16 with AVX-512, 8 with AVX2+FMA+F16C, 1 as the portable scalar fallback),
// and loads that widen stored weights to f32 in registers (bf16: a 16-bit shift; f16: F16C).
// Kernels are written once against this vocabulary; the scalar build (kLanes = 1) runs the
// exact same loops, so a machine without AVX still gets correct results. Tails shorter than
// a vector are handled by the caller with the scalar loads (load_scalar).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__AVX512F__) || defined(__AVX2__)
// g++ 12 reports -W(maybe-)uninitialized inside its own AVX-512 intrinsics (GCC PR105593: the
// `__Y = __Y` undefined-vector idiom); silence it for the header's lines only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "engine/core/dtype.h"

namespace attnres::cpu {

// Storage type of a weight element for each dtype the kernels accept.
template <DType W>
struct Stored;
template <>
struct Stored<DType::F32> {
  using type = float;
};
template <>
struct Stored<DType::BF16> {
  using type = uint16_t;
};
template <>
struct Stored<DType::F16> {
  using type = uint16_t;
};
template <DType W>
using StoredT = typename Stored<W>::type;

template <DType W>
inline float load_scalar(const StoredT<W>* p) {
  if constexpr (W == DType::F32) {
    return *p;
  } else if constexpr (W == DType::BF16) {
    return bf16_to_f32(*p);
  } else {
    return f16_to_f32(*p);
  }
}

#if defined(__AVX512F__)

inline constexpr int kLanes = 16;
using VecF = __m512;
inline VecF vzero() { return _mm512_setzero_ps(); }
inline VecF vset1(float a) { return _mm512_set1_ps(a); }
inline VecF vload(const float* p) { return _mm512_loadu_ps(p); }
inline void vstore(float* p, VecF v) { _mm512_storeu_ps(p, v); }
inline VecF vadd(VecF a, VecF b) { return _mm512_add_ps(a, b); }
inline VecF vsub(VecF a, VecF b) { return _mm512_sub_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF vdiv(VecF a, VecF b) { return _mm512_div_ps(a, b); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
// The sum of the 16 lanes as a fixed tree, written out so that the order is ours, not the
// compiler's (batch invariance needs hsum16 below to round exactly like it): halves of 8
// (lane i + lane i+8), of 4, then (0 + 2) and (1 + 3), then their sum. Bit-identical to GCC's
// _mm512_reduce_add_ps, which computes the same tree.
inline float hsum(VecF v) {
  __m256 t = _mm256_add_ps(_mm512_castps512_ps256(v),
                           _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  __m128 u = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
  __m128 w = _mm_add_ps(u, _mm_shuffle_ps(u, u, 0x4e));  // lanes (0 + 2, 1 + 3, ...)
  return _mm_cvtss_f32(w) + _mm_cvtss_f32(_mm_shuffle_ps(w, w, 0x55));
}
// Lane j of the result = hsum(a[j]) bit for bit (the same adds of the same pairs), for 16
// vectors at once: the adds of each level of the tree are shared across vectors, 15 adds and
// 30 shuffles in all instead of 16 x (4 adds + 4 shuffles).
inline VecF hsum16(const VecF* a) {
  VecF t[8], u[4], w[2];
  for (int p = 0; p < 8; ++p)  // [a lo256 + hi256 | b lo256 + hi256]
    t[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xee));
  for (int q = 0; q < 4; ++q)  // 128-bit lane m: vector 4q + m, its lanes (i + i+4)
    u[q] = _mm512_add_ps(_mm512_shuffle_f32x4(t[2 * q], t[2 * q + 1], 0x88),
                         _mm512_shuffle_f32x4(t[2 * q], t[2 * q + 1], 0xdd));
  for (int h = 0; h < 2; ++h)  // lane m: [v.(0+2), v.(1+3), v'.(0+2), v'.(1+3)], v' = v + 4
    w[h] = _mm512_add_ps(_mm512_shuffle_ps(u[2 * h], u[2 * h + 1], 0x44),
                         _mm512_shuffle_ps(u[2 * h], u[2 * h + 1], 0xee));
  // Lane 4m + p now holds vector m + 4p; put vector j in lane j.
  VecF r = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xdd));
  const __m512i to_order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(to_order, r);
}
template <DType W>
inline VecF vload_w(const StoredT<W>* p) {
  if constexpr (W == DType::F32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (W == DType::BF16) {
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
}
// Stores v rounded to bf16 exactly as f32_to_bf16 (nearest even; NaN stays a quiet NaN).
// Integer arithmetic rather than AVX512_BF16's vcvtneps2bf16, which flushes denormals.
inline void vstore_bf16(uint16_t* p, VecF v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(bits, _mm512_set1_epi32(0x400000)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(_mm512_srli_epi32(r, 16)));
}
inline VecF vfloor(VecF a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF); }
// a * 2^n for integral n (stays exact through the denormal range).
inline VecF vscale2(VecF a, VecF n) { return _mm512_scalef_ps(a, n); }
inline VecF vmin(VecF a, VecF b) { return _mm512_min_ps(a, b); }
inline VecF vmax(VecF a, VecF b) { return _mm512_max_ps(a, b); }

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

inline constexpr int kLanes = 8;
using VecF = __m256;
inline VecF vzero() { return _mm256_setzero_ps(); }
inline VecF vset1(float a) { return _mm256_set1_ps(a); }
inline VecF vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline VecF vadd(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF vsub(VecF a, VecF b) { return _mm256_sub_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
inline VecF vdiv(VecF a, VecF b) { return _mm256_div_ps(a, b); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm256_fmadd_ps(a, b, c); }
inline float hsum(VecF v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
template <DType W>
inline VecF vload_w(const StoredT<W>* p) {
  if constexpr (W == DType::F32) {
    return _mm256_loadu_ps(p);
  } else if constexpr (W == DType::BF16) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
}
// Stores v rounded to bf16 exactly as f32_to_bf16 (nearest even; NaN stays a quiet NaN).
inline void vstore_bf16(uint16_t* p, VecF v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  r = _mm256_blendv_epi8(r, _mm256_or_si256(bits, _mm256_set1_epi32(0x400000)), nan);
  r = _mm256_srli_epi32(r, 16);
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
inline VecF vfloor(VecF a) { return _mm256_floor_ps(a); }
// a * 2^n for integral n in [-126, 127] (vexp keeps n there).
inline VecF vscale2(VecF a, VecF n) {
  __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(a, _mm256_castsi256_ps(e));
}
inline VecF vmin(VecF a, VecF b) { return _mm256_min_ps(a, b); }
inline VecF vmax(VecF a, VecF b) { return _mm256_max_ps(a, b); }

#else  // portable scalar fallback: a "vector" of one lane

inline constexpr int kLanes = 1;
using VecF = float;
inline VecF vzero() { return 0.0f; }
inline VecF vset1(float a) { return a; }
inline VecF vload(const float* p) { return *p; }
inline void vstore(float* p, VecF v) { *p = v; }
inline VecF vadd(VecF a, VecF b) { return a + b; }
inline VecF vsub(VecF a, VecF b) { return a - b; }
inline VecF vmul(VecF a, VecF b) { return a * b; }
inline VecF vdiv(VecF a, VecF b) { return a / b; }
inline VecF vfma(VecF a, VecF b, VecF c) { return a * b + c; }
inline float hsum(VecF v) { return v; }
template <DType W>
inline VecF vload_w(const StoredT<W>* p) {
  return load_scalar<W>(p);
}
inline void vstore_bf16(uint16_t* p, VecF v) { *p = f32_to_bf16(v); }
inline VecF vfloor(VecF a) { return std::floor(a); }
inline VecF vscale2(VecF a, VecF n) { return std::ldexp(a, static_cast<int>(n)); }
inline VecF vmin(VecF a, VecF b) { return a < b ? a : b; }
inline VecF vmax(VecF a, VecF b) { return a > b ? a : b; }

#endif

// The instructions these kernels are compiled for (the build's -march: ATTNRES_CPU_ARCH), as
// CpuBackend::name() reports them: a portable image holds one build per level
// (docker/build-cpu-variants.sh), and the log says which one runs.
inline constexpr const char* kSimdName =
#if defined(__AVX512F__) && defined(__AVX512BF16__)
    "AVX-512 BF16";
#elif defined(__AVX512F__)
    "AVX-512";
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
    "AVX2";
#else
    "scalar";
#endif

// v, kept in a register: the compiler may otherwise fold a load into every FMA that reads
// it as a memory operand, loading a vector R times where the kernel loads it once for R rows.
// The dev VM's cores issue one 512-bit load per cycle against two FMAs, so such a loop is
// load-bound (docs/BENCHMARKS.md: Phase 1's logit pass, 18 -> 12 cycles per vector).
inline VecF in_register(VecF v) {
#if defined(__AVX512F__) || defined(__AVX2__)
  __asm__("" : "+v"(v));
#endif
  return v;
}

// sums[j] = hsum(v[j]) for j < n, bit for bit; AVX-512 shares the tree's levels across 16
// vectors at a time (hsum16).
inline void hsum_many(const VecF* v, int n, float* sums) {
  int j = 0;
#if defined(__AVX512F__)
  for (; j + 16 <= n; j += 16) vstore(sums + j, hsum16(v + j));
  if (n - j > 1) {  // the rest, padded with zeros
    VecF rest[16];
    for (int i = 0; i < 16; ++i) rest[i] = j + i < n ? v[j + i] : vzero();
    alignas(64) float out[16];
    vstore(out, hsum16(rest));
    for (; j < n; ++j) sums[j] = out[j % 16];
  }
#endif
  for (; j < n; ++j) sums[j] = hsum(v[j]);
}

// An op's output element, f32 or bf16: a linear's input rows may be written in bf16 by their
// producer (Backend::linear_input_dtype), rounded as f32_to_bf16, the same bits as an f32
// store followed by a rounding pass.
inline void vstore_as(float* p, VecF v) { vstore(p, v); }
inline void vstore_as(uint16_t* p, VecF v) { vstore_bf16(p, v); }
inline void store_as(float* p, float v) { *p = v; }
inline void store_as(uint16_t* p, float v) { *p = f32_to_bf16(v); }

// dst[i] = x[i] rounded to bf16 (f32_to_bf16), a vector at a time.
inline void store_row_bf16(uint16_t* dst, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) vstore_bf16(dst + i, vload(x + i));
  for (; i < n; ++i) dst[i] = f32_to_bf16(x[i]);
}

// e^x lane-wise, within a few ulp of std::exp for x in [-87, 88] (Cephes' expf: x = n ln2 + r,
// |r| <= ln2 / 2, a degree-7 polynomial for e^r, times 2^n); x is clamped to that range
// (softmax passes x <= 0, where e^-87 is already below every weight that counts). The same
// input gives the same bits on every call: softmax needs that for batch invariance.
inline VecF vexp(VecF x) {
  x = vmax(vmin(x, vset1(88.0f)), vset1(-87.3365447504019f));
  const VecF n = vfloor(vfma(x, vset1(1.44269504088896341f), vset1(0.5f)));
  VecF r = vfma(n, vset1(-0.693359375f), x);
  r = vfma(n, vset1(2.12194440e-4f), r);
  VecF y = vset1(1.9875691500e-4f);
  y = vfma(y, r, vset1(1.3981999507e-3f));
  y = vfma(y, r, vset1(8.3334519073e-3f));
  y = vfma(y, r, vset1(4.1665795894e-2f));
  y = vfma(y, r, vset1(1.6666665459e-1f));
  y = vfma(y, r, vset1(5.0000001201e-1f));
  y = vadd(vfma(y, vmul(r, r), r), vset1(1.0f));
  return vscale2(y, n);
}

// out[i] = 1 / (1 + e^-x[i]) for i < n, through vexp (the tail padded into one vector), so
// every element rounds the same way wherever it sits in the row.
inline void sigmoid_f32(const float* x, float* out, int64_t n) {
  const VecF one = vset1(1.0f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    vstore(out + i, vdiv(one, vadd(one, vexp(vsub(vzero(), vload(x + i))))));
  if (i < n) {
    alignas(64) float lanes[kLanes];
    for (int l = 0; l < kLanes; ++l) lanes[l] = i + l < n ? x[i + l] : 0.0f;
    vstore(lanes, vdiv(one, vadd(one, vexp(vsub(vzero(), vload(lanes))))));
    for (int l = 0; i < n; ++l, ++i) out[i] = lanes[l];
  }
}

// x[i] = e^(x[i] - max_i x[i]) for i < n (n >= 1); returns their sum (lane-wise partial sums,
// then hsum, then the tail lanes in order): the numerators and denominator of a softmax.
inline float softmax_numerators(float* x, int64_t n) {
  VecF m = vset1(x[0]);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) m = vmax(m, vload(x + i));
  alignas(64) float lanes[kLanes];
  vstore(lanes, m);
  float max_x = lanes[0];
  for (int l = 1; l < kLanes; ++l) max_x = std::max(max_x, lanes[l]);
  for (; i < n; ++i) max_x = std::max(max_x, x[i]);
  const VecF vmax_x = vset1(max_x);
  VecF sum = vzero();
  for (i = 0; i + kLanes <= n; i += kLanes) {
    const VecF e = vexp(vsub(vload(x + i), vmax_x));
    vstore(x + i, e);
    sum = vadd(sum, e);
  }
  float total = hsum(sum);
  if (i < n) {  // the tail through the same vexp, padded
    for (int l = 0; l < kLanes; ++l) lanes[l] = i + l < n ? x[i + l] - max_x : 0.0f;
    vstore(lanes, vexp(vload(lanes)));
    for (int l = 0; i < n; ++l, ++i) total += (x[i] = lanes[l]);
  }
  return total;
}

// dot_w in two parts, so that many dot products can share one horizontal sum (hsum_many):
// dot_w(a, b, n) == dot_w_tail(a, b, n, hsum(dot_w_fold(a, b, n))), bit for bit.
// The vector part: two FMA chains over the whole vectors of n, added.
template <DType W>
inline VecF dot_w_fold(const float* a, const StoredT<W>* b, int64_t n) {
  VecF acc0 = vzero(), acc1 = vzero();
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    acc0 = vfma(vload(a + i), vload_w<W>(b + i), acc0);
    acc1 = vfma(vload(a + i + kLanes), vload_w<W>(b + i + kLanes), acc1);
  }
  for (; i + kLanes <= n; i += kLanes) acc0 = vfma(vload(a + i), vload_w<W>(b + i), acc0);
  return vadd(acc0, acc1);
}
// The scalar part: s (the folded vector's hsum) plus the elements past the last whole vector.
template <DType W>
inline float dot_w_tail(const float* a, const StoredT<W>* b, int64_t n, float s) {
  for (int64_t i = n / kLanes * kLanes; i < n; ++i) s = std::fma(a[i], load_scalar<W>(b + i), s);
  return s;
}

// sum_i a[i] * b[i] with b stored as W (f32 or bf16, e.g. a KV cache row), widened in
// registers. With W = BF16 the result is bit-identical to W = F32 over b already widened.
template <DType W>
inline float dot_w(const float* a, const StoredT<W>* b, int64_t n) {
  return dot_w_tail<W>(a, b, n, hsum(dot_w_fold<W>(a, b, n)));
}

// sum_i a[i] * b[i] over n f32 values.
inline float dot_f32(const float* a, const float* b, int64_t n) {
  return dot_w<DType::F32>(a, b, n);
}

// sum_i a[i]^2 over n f32 values.
inline float sum_squares_f32(const float* a, int64_t n) { return dot_f32(a, a, n); }

// y[i] = y[i] * c + a * x[i]  (c, a scalars): the online-softmax rescale-and-add.
inline void scale_add_f32(float* y, float c, float a, const float* x, int64_t n) {
  VecF vc = vset1(c), va = vset1(a);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    vstore(y + i, vfma(va, vload(x + i), vmul(vc, vload(y + i))));
  for (; i < n; ++i) y[i] = y[i] * c + a * x[i];
}

}  // namespace attnres::cpu
