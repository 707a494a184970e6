// AVX-512 helpers of the quantized linear kernels (cpu_linear_quant.cpp, cpu_linear_q6.cpp,
// cpu_linear_q6k.cpp): lane reductions and transposes, broadcasts, f16 gathers and a
// spread-out prefetch. Only where the build targets AVX-512 VNNI.
#pragma once

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace attnres::cpu::vnni {

// 4 x 4 transpose of 128-bit lanes: f[L] = [u0.L, u1.L, u2.L, u3.L].
inline void transpose_lanes4(const __m512i* u, __m512i* f) {
  const __m512i t0 = _mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(2, 0, 2, 0));
  const __m512i t1 = _mm512_shuffle_i32x4(u[0], u[1], _MM_SHUFFLE(3, 1, 3, 1));
  const __m512i t2 = _mm512_shuffle_i32x4(u[2], u[3], _MM_SHUFFLE(2, 0, 2, 0));
  const __m512i t3 = _mm512_shuffle_i32x4(u[2], u[3], _MM_SHUFFLE(3, 1, 3, 1));
  f[0] = _mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(2, 0, 2, 0));
  f[1] = _mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(2, 0, 2, 0));
  f[2] = _mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(3, 1, 3, 1));
  f[3] = _mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(3, 1, 3, 1));
}

// v[j] (j < 16): int32 lanes of output j. f[L] lane j = the sum of v[j]'s 128-bit lane L.
inline void reduce16(const __m512i* v, __m512i* f) {
  __m512i t[8], u[4];
  for (int p = 0; p < 8; ++p)  // per 128-bit lane [a0 + a2, b0 + b2, a1 + a3, b1 + b3]
    t[p] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * p], v[2 * p + 1]),
                            _mm512_unpackhi_epi32(v[2 * p], v[2 * p + 1]));
  for (int q = 0; q < 4; ++q)  // per 128-bit lane: outputs 4q .. 4q + 3
    u[q] = _mm512_add_epi32(_mm512_unpacklo_epi64(t[2 * q], t[2 * q + 1]),
                            _mm512_unpackhi_epi64(t[2 * q], t[2 * q + 1]));
  transpose_lanes4(u, f);
}

// The 16 x 16 transpose of int32 words: t[w] lane j = v[j] word w.
inline void transpose16(const __m512i* v, __m512i* t) {
  __m512i a[16], u[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  // u[4i + c], 128-bit lane L: rows 4i .. 4i + 3, word 4L + c.
  for (int i = 0; i < 4; ++i) {
    u[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    u[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    u[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    u[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i q[4] = {u[c], u[4 + c], u[8 + c], u[12 + c]};
    __m512i f[4];
    transpose_lanes4(q, f);
    for (int l = 0; l < 4; ++l) t[4 * l + c] = f[l];
  }
}

// The 4 bytes at p in every 32-bit lane.
inline __m512i broadcast_word(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// The f16 at p + idx[j] + 2 (j < 16) as f32: a gather of the 4 bytes that end there (the
// bytes before a scale or min must be in the row).
inline __m512 gather_f16(const uint8_t* p, __m512i idx) {
  const __m512i g = _mm512_i32gather_epi32(idx, p - 2, 1);
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g, 16)));
}

// Prefetches (into L2) a region a fixed share at a time, so that a later pass over it finds
// it there (a hint: no value changes).
class RegionPrefetch {
 public:
  RegionPrefetch(const uint8_t* begin, const uint8_t* end, int64_t calls)
      : p_(begin), end_(end), per_call_((end - begin + 64 * calls - 1) / (64 * calls)) {}
  void step() {
    for (int64_t i = 0; i < per_call_ && p_ < end_; ++i, p_ += 64) __builtin_prefetch(p_, 0, 2);
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
  int64_t per_call_;
};

}  // namespace attnres::cpu::vnni
#endif
