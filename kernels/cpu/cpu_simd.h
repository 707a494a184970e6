// A tiny SIMD vocabulary shared by the CPU kernels: one "vector of f32" type VecF with
// kLanes lanes (16 with AVX-512, 8 with AVX2+FMA+F16C, 1 as the portable scalar fallback),
// and loads that widen stored weights to f32 in registers (bf16: a 16-bit shift; f16: F16C).
// Kernels are written once against this vocabulary; the scalar build (kLanes = 1) runs the
// exact same loops, so a machine without AVX still gets correct results. Tails shorter than
// a vector are handled by the caller with the scalar loads (load_scalar).
#pragma once

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
inline VecF vmul(VecF a, VecF b) { return _mm512_mul_ps(a, b); }
inline VecF vfma(VecF a, VecF b, VecF c) { return _mm512_fmadd_ps(a, b, c); }
inline float hsum(VecF v) { return _mm512_reduce_add_ps(v); }
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

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

inline constexpr int kLanes = 8;
using VecF = __m256;
inline VecF vzero() { return _mm256_setzero_ps(); }
inline VecF vset1(float a) { return _mm256_set1_ps(a); }
inline VecF vload(const float* p) { return _mm256_loadu_ps(p); }
inline void vstore(float* p, VecF v) { _mm256_storeu_ps(p, v); }
inline VecF vadd(VecF a, VecF b) { return _mm256_add_ps(a, b); }
inline VecF vmul(VecF a, VecF b) { return _mm256_mul_ps(a, b); }
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

#else  // portable scalar fallback: a "vector" of one lane

inline constexpr int kLanes = 1;
using VecF = float;
inline VecF vzero() { return 0.0f; }
inline VecF vset1(float a) { return a; }
inline VecF vload(const float* p) { return *p; }
inline void vstore(float* p, VecF v) { *p = v; }
inline VecF vadd(VecF a, VecF b) { return a + b; }
inline VecF vmul(VecF a, VecF b) { return a * b; }
inline VecF vfma(VecF a, VecF b, VecF c) { return a * b + c; }
inline float hsum(VecF v) { return v; }
template <DType W>
inline VecF vload_w(const StoredT<W>* p) {
  return load_scalar<W>(p);
}

#endif

// sum_i a[i] * b[i] over n f32 values, two independent accumulator chains.
inline float dot_f32(const float* a, const float* b, int64_t n) {
  VecF acc0 = vzero(), acc1 = vzero();
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    acc0 = vfma(vload(a + i), vload(b + i), acc0);
    acc1 = vfma(vload(a + i + kLanes), vload(b + i + kLanes), acc1);
  }
  for (; i + kLanes <= n; i += kLanes) acc0 = vfma(vload(a + i), vload(b + i), acc0);
  float s = hsum(vadd(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// sum_i a[i] * b[i] with b stored as W (f32 or bf16, e.g. a KV cache row), widened in
// registers. The same loop structure as dot_f32, so with W = BF16 the result is bit-identical
// to dot_f32 over b already widened to f32.
template <DType W>
inline float dot_w(const float* a, const StoredT<W>* b, int64_t n) {
  VecF acc0 = vzero(), acc1 = vzero();
  int64_t i = 0;
  for (; i + 2 * kLanes <= n; i += 2 * kLanes) {
    acc0 = vfma(vload(a + i), vload_w<W>(b + i), acc0);
    acc1 = vfma(vload(a + i + kLanes), vload_w<W>(b + i + kLanes), acc1);
  }
  for (; i + kLanes <= n; i += kLanes) acc0 = vfma(vload(a + i), vload_w<W>(b + i), acc0);
  float s = hsum(vadd(acc0, acc1));
  for (; i < n; ++i) s += a[i] * load_scalar<W>(b + i);
  return s;
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

// y[i] = y[i] * c + a * x[i] with x stored as W (f32 or bf16), widened in registers; the same
// arithmetic as scale_add_f32.
template <DType W>
inline void scale_add_w(float* y, float c, float a, const StoredT<W>* x, int64_t n) {
  VecF vc = vset1(c), va = vset1(a);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    vstore(y + i, vfma(va, vload_w<W>(x + i), vmul(vc, vload(y + i))));
  for (; i < n; ++i) y[i] = y[i] * c + a * load_scalar<W>(x + i);
}

}  // namespace attnres::cpu
