// The quantized linear (cpu_linear_quant.h). Each build has one kernel per weight format, a
// struct with:
//   kStep          weights per step (a whole number of blocks of 32)
//   kActStepBytes  bytes of one step of a quantized activation row (QuantizedRows' layout)
//   quantize_row   x [k] -> the activation row in that layout
//   W, load        one step of one weight row, unpacked into registers
//   step           acc += that step's scaled block sums against one activation row
//   finish         the accumulator's lanes summed by a fixed tree
// A row of k weights is ceil(k / kStep) steps; a last partial step reads only its whole
// blocks (the rest is zero in the weights' registers and in the activation row). The GEMV and
// the GEMM below call the same load / step / finish per output, in the same order.
#include "kernels/cpu/cpu_linear_quant.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/thread_scratch.h"

namespace attnres::cpu {

float quantize_activation_block(const float* x, int8_t* q) {
  float amax = 0.0f;
  for (int j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  for (int j = 0; j < kQuantBlock; ++j) {
    const float v = d == 0.0f ? 0.0f : std::nearbyint(x[j] / d);
    q[j] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
  }
  return d;
}

namespace {

constexpr int kB = static_cast<int>(kQuantBlock);

[[maybe_unused]] uint16_t load_u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// Whole blocks in step s of a row of k weights.
inline int blocks_in_step(int64_t k, int64_t s, int step) {
  return static_cast<int>(std::min<int64_t>(step, k - s * step) / kB);
}

// Quantizes the blocks of step s (all its kStep / 32, those past k as zeros) into q[] (block
// after block) and d[], sums[] (dx, and sum of qx per block).
inline void quantize_step(const float* x, int64_t k, int64_t s, int step, int8_t* q, float* d,
                          int32_t* sums) {
  const int whole = blocks_in_step(k, s, step);
  for (int b = 0; b < step / kB; ++b) {
    int8_t* qb = q + b * kB;
    if (b < whole) {
      d[b] = quantize_activation_block(x + s * step + b * kB, qb);
    } else {
      std::memset(qb, 0, kB);
      d[b] = 0.0f;
    }
    int32_t sum = 0;
    for (int j = 0; j < kB; ++j) sum += qb[j];
    sums[b] = sum;
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
constexpr const char* kIsa = "avx512-vnni";

// Q8_B32: a step is 2 blocks, 64 bytes. vpdpbusd multiplies unsigned by signed bytes, so the
// activation row stores qx + 128 (u8) and the weights' lane sums times 128 are subtracted
// (the accumulator starts from -128 sum qw): exact. Each block's sum lands in 8 int32 lanes
// (0-7, 8-15), scaled by dw dx for that block.
// Activation step: u8 xu[64], f32 dx16[16] (dx of the step's first block in lanes 0-7,
// second in 8-15).
struct Q8Kernel {
  static constexpr int kStep = 64;
  static constexpr int64_t kActStepBytes = 128;
  using Acc = __m512;

  static void quantize_row(const float* x, int64_t k, uint8_t* act) {
    const int64_t steps = (k + kStep - 1) / kStep;
    for (int64_t s = 0; s < steps; ++s) {
      uint8_t* a = act + s * kActStepBytes;
      int8_t q[kStep];
      float d[2];
      int32_t sums[2];
      quantize_step(x, k, s, kStep, q, d, sums);
      for (int j = 0; j < kStep; ++j) a[j] = static_cast<uint8_t>(q[j] + 128);
      float* dx = reinterpret_cast<float*>(a + 64);
      for (int j = 0; j < 16; ++j) dx[j] = d[j / 8];
    }
  }

  struct W {
    __m512i q, neg_corr;
    __m512 dw;
  };
  static W load(const uint8_t* quants, const uint8_t* scales, const uint8_t* /*mins*/, int64_t k,
                int64_t s) {
    const int whole = blocks_in_step(k, s, kStep);
    const __mmask64 qmask = whole == 2 ? ~__mmask64{0} : __mmask64{0xffffffff};
    W w;
    w.q = _mm512_maskz_loadu_epi8(qmask, quants + s * kStep);
    const __m128i h =
        _mm_maskz_loadu_epi16(static_cast<__mmask8>((1u << whole) - 1), scales + 4 * s);
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    w.dw = _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_cvtph_ps(h)));
    const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
    w.neg_corr = _mm512_sub_epi32(_mm512_setzero_si512(),
                                  _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, w.q));
    return w;
  }
  static Acc step(Acc acc, const W& w, const uint8_t* a) {
    const __m512i xu = _mm512_load_si512(a);
    const __m512i dot = _mm512_dpbusd_epi32(w.neg_corr, xu, w.q);
    const __m512 scale =
        _mm512_mul_ps(w.dw, _mm512_load_ps(reinterpret_cast<const float*>(a + 64)));
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
  }
  static Acc zero() { return _mm512_setzero_ps(); }
  static float finish(Acc acc) { return hsum(acc); }
};

// Q4_B32: a step is 4 blocks, 64 packed bytes: the low nibbles are each block's first 16
// weights, the high ones its last 16 (quant_format.h), so the activation row stores the four
// blocks' first halves (xlo) and second halves (xhi) as two vectors that line up with them.
// Block b's sum lands in int32 lanes 4b..4b+3; its min term m_b (dx_b sum qx) is added in
// lane 4b.
// Activation step: s8 xlo[64], s8 xhi[64], f32 dx16[16] (dx_b in lanes 4b..4b+3), f32
// dxs16[16] (dx_b * sum_j qx_j in lane 4b, zero in the others).
struct Q4Kernel {
  static constexpr int kStep = 128;
  static constexpr int64_t kActStepBytes = 256;
  using Acc = __m512;

  static void quantize_row(const float* x, int64_t k, uint8_t* act) {
    const int64_t steps = (k + kStep - 1) / kStep;
    for (int64_t s = 0; s < steps; ++s) {
      uint8_t* a = act + s * kActStepBytes;
      int8_t q[kStep];
      float d[4];
      int32_t sums[4];
      quantize_step(x, k, s, kStep, q, d, sums);
      auto* xlo = reinterpret_cast<int8_t*>(a);
      auto* xhi = reinterpret_cast<int8_t*>(a + 64);
      for (int b = 0; b < 4; ++b) {
        std::memcpy(xlo + 16 * b, q + kB * b, 16);
        std::memcpy(xhi + 16 * b, q + kB * b + 16, 16);
      }
      float* dx = reinterpret_cast<float*>(a + 128);
      float* dxs = reinterpret_cast<float*>(a + 192);
      for (int j = 0; j < 16; ++j) {
        dx[j] = d[j / 4];
        dxs[j] = j % 4 == 0 ? d[j / 4] * static_cast<float>(sums[j / 4]) : 0.0f;
      }
    }
  }

  struct W {
    __m512i lo, hi;
    __m512 dw, m;
  };
  static W load(const uint8_t* quants, const uint8_t* scales, const uint8_t* mins, int64_t k,
                int64_t s) {
    const int whole = blocks_in_step(k, s, kStep);
    const __mmask64 qmask = whole == 4 ? ~__mmask64{0} : (__mmask64{1} << (16 * whole)) - 1;
    const __mmask8 hmask = static_cast<__mmask8>((1u << whole) - 1);
    const __m512i packed = _mm512_maskz_loadu_epi8(qmask, quants + s * 64);
    const __m512i nib = _mm512_set1_epi8(0x0f);
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    W w;
    w.lo = _mm512_and_si512(packed, nib);
    w.hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), nib);
    w.dw = _mm512_permutexvar_ps(
        idx, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_maskz_loadu_epi16(hmask, scales + 8 * s))));
    w.m = _mm512_permutexvar_ps(
        idx, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_maskz_loadu_epi16(hmask, mins + 8 * s))));
    return w;
  }
  static Acc step(Acc acc, const W& w, const uint8_t* a) {
    __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.lo, _mm512_load_si512(a));
    dot = _mm512_dpbusd_epi32(dot, w.hi, _mm512_load_si512(a + 64));
    const __m512 scale =
        _mm512_mul_ps(w.dw, _mm512_load_ps(reinterpret_cast<const float*>(a + 128)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc);
    return _mm512_fmadd_ps(w.m, _mm512_load_ps(reinterpret_cast<const float*>(a + 192)), acc);
  }
  static Acc zero() { return _mm512_setzero_ps(); }
  static float finish(Acc acc) { return hsum(acc); }
};

#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
constexpr const char* kIsa = "avx2";

// Lanes 0..7 summed as a fixed tree: (i + i+4), then (0 + 2, 1 + 3), then their sum.
inline float hsum8(__m256 v) {
  __m128 u = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 w = _mm_add_ps(u, _mm_shuffle_ps(u, u, 0x4e));
  return _mm_cvtss_f32(w) + _mm_cvtss_f32(_mm_shuffle_ps(w, w, 0x55));
}

// Q8_B32: a step is 1 block. vpmaddubsw multiplies unsigned by signed bytes with int16
// saturation, so it gets |qw| and qx with qw's sign (|qw qx| <= 127 * 127: pairs never
// saturate); vpmaddwd sums pairs into 8 int32 lanes, scaled by dw dx.
// Activation step: s8 q[32], f32 dx, padding to 64 bytes.
struct Q8Kernel {
  static constexpr int kStep = 32;
  static constexpr int64_t kActStepBytes = 64;
  using Acc = __m256;

  static void quantize_row(const float* x, int64_t k, uint8_t* act) {
    for (int64_t s = 0; s < k / kStep; ++s) {
      uint8_t* a = act + s * kActStepBytes;
      const float d = quantize_activation_block(x + s * kStep, reinterpret_cast<int8_t*>(a));
      std::memcpy(a + 32, &d, 4);
    }
  }

  struct W {
    __m256i q;
    float dw;
  };
  static W load(const uint8_t* quants, const uint8_t* scales, const uint8_t* /*mins*/,
                int64_t /*k*/, int64_t s) {
    return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + s * kStep)),
            f16_to_f32(load_u16(scales + 2 * s))};
  }
  static Acc step(Acc acc, const W& w, const uint8_t* a) {
    const __m256i x = _mm256_load_si256(reinterpret_cast<const __m256i*>(a));
    const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w.q), _mm256_sign_epi8(x, w.q));
    const __m256i dot = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    float dx;
    std::memcpy(&dx, a + 32, 4);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(w.dw * dx), acc);
  }
  static Acc zero() { return _mm256_setzero_ps(); }
  static float finish(Acc acc) { return hsum8(acc); }
};

// Q4_B32: a step is 2 blocks, 32 packed bytes, laid out as in the AVX-512 kernel: block b's
// sum in int32 lanes 4b..4b+3, its min term in lane 4b.
// Activation step: s8 xlo[32], s8 xhi[32], f32 dx8[8], f32 dxs8[8].
struct Q4Kernel {
  static constexpr int kStep = 64;
  static constexpr int64_t kActStepBytes = 128;
  using Acc = __m256;

  static void quantize_row(const float* x, int64_t k, uint8_t* act) {
    const int64_t steps = (k + kStep - 1) / kStep;
    for (int64_t s = 0; s < steps; ++s) {
      uint8_t* a = act + s * kActStepBytes;
      int8_t q[kStep];
      float d[2];
      int32_t sums[2];
      quantize_step(x, k, s, kStep, q, d, sums);
      for (int b = 0; b < 2; ++b) {
        std::memcpy(a + 16 * b, q + kB * b, 16);
        std::memcpy(a + 32 + 16 * b, q + kB * b + 16, 16);
      }
      float* dx = reinterpret_cast<float*>(a + 64);
      float* dxs = reinterpret_cast<float*>(a + 96);
      for (int j = 0; j < 8; ++j) {
        dx[j] = d[j / 4];
        dxs[j] = j % 4 == 0 ? d[j / 4] * static_cast<float>(sums[j / 4]) : 0.0f;
      }
    }
  }

  struct W {
    __m256i lo, hi;
    __m256 dw, m;
  };
  static W load(const uint8_t* quants, const uint8_t* scales, const uint8_t* mins, int64_t k,
                int64_t s) {
    const int whole = blocks_in_step(k, s, kStep);
    __m256i packed;
    uint32_t hd = 0, hm = 0;
    if (whole == 2) {
      packed = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(quants + s * 32));
      std::memcpy(&hd, scales + 4 * s, 4);
      std::memcpy(&hm, mins + 4 * s, 4);
    } else {
      packed = _mm256_zextsi128_si256(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(quants + s * 32)));
      hd = load_u16(scales + 4 * s);
      hm = load_u16(mins + 4 * s);
    }
    const __m256i nib = _mm256_set1_epi8(0x0f);
    const __m256i idx = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    W w;
    w.lo = _mm256_and_si256(packed, nib);
    w.hi = _mm256_and_si256(_mm256_srli_epi16(packed, 4), nib);
    w.dw = _mm256_permutevar8x32_ps(
        _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(hd)))), idx);
    w.m = _mm256_permutevar8x32_ps(
        _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(hm)))), idx);
    return w;
  }
  static Acc step(Acc acc, const W& w, const uint8_t* a) {
    const auto* v = reinterpret_cast<const __m256i*>(a);
    const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, _mm256_load_si256(v)),
                                       _mm256_maddubs_epi16(w.hi, _mm256_load_si256(v + 1)));
    const __m256i dot = _mm256_madd_epi16(p, _mm256_set1_epi16(1));
    const __m256 scale =
        _mm256_mul_ps(w.dw, _mm256_load_ps(reinterpret_cast<const float*>(a + 64)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc);
    return _mm256_fmadd_ps(w.m, _mm256_load_ps(reinterpret_cast<const float*>(a + 96)), acc);
  }
  static Acc zero() { return _mm256_setzero_ps(); }
  static float finish(Acc acc) { return hsum8(acc); }
};

#else
constexpr const char* kIsa = "scalar";

// One block per step: its exact integer sum, then acc = fma(sum, dw dx, acc) (and, Q4_B32,
// acc = fma(m, dx sum qx, acc)), blocks in order.
// Activation step: s8 q[32], f32 dx, f32 dx * sum qx.
struct ScalarKernelBase {
  static constexpr int kStep = 32;
  static constexpr int64_t kActStepBytes = 64;
  using Acc = float;
  static void quantize_row(const float* x, int64_t k, uint8_t* act) {
    for (int64_t s = 0; s < k / kStep; ++s) {
      uint8_t* a = act + s * kActStepBytes;
      auto* q = reinterpret_cast<int8_t*>(a);
      const float d = quantize_activation_block(x + s * kStep, q);
      int32_t sum = 0;
      for (int j = 0; j < kB; ++j) sum += q[j];
      const float ds = d * static_cast<float>(sum);
      std::memcpy(a + 32, &d, 4);
      std::memcpy(a + 36, &ds, 4);
    }
  }
  static Acc zero() { return 0.0f; }
  static float finish(Acc acc) { return acc; }
};

struct Q8Kernel : ScalarKernelBase {
  struct W {
    const int8_t* q;
    float dw;
  };
  static W load(const uint8_t* quants, const uint8_t* scales, const uint8_t*, int64_t, int64_t s) {
    return {reinterpret_cast<const int8_t*>(quants) + s * kStep,
            f16_to_f32(load_u16(scales + 2 * s))};
  }
  static Acc step(Acc acc, const W& w, const uint8_t* a) {
    const auto* x = reinterpret_cast<const int8_t*>(a);
    int32_t sum = 0;
    for (int j = 0; j < kB; ++j) sum += int32_t{w.q[j]} * x[j];
    float dx;
    std::memcpy(&dx, a + 32, 4);
    return std::fma(static_cast<float>(sum), w.dw * dx, acc);
  }
};

struct Q4Kernel : ScalarKernelBase {
  struct W {
    const uint8_t* packed;
    float dw, m;
  };
  static W load(const uint8_t* quants, const uint8_t* scales, const uint8_t* mins, int64_t,
                int64_t s) {
    return {quants + s * 16, f16_to_f32(load_u16(scales + 2 * s)),
            f16_to_f32(load_u16(mins + 2 * s))};
  }
  static Acc step(Acc acc, const W& w, const uint8_t* a) {
    const auto* x = reinterpret_cast<const int8_t*>(a);
    int32_t sum = 0;
    for (int j = 0; j < 16; ++j)
      sum += int32_t{w.packed[j] & 0x0f} * x[j] + int32_t{w.packed[j] >> 4} * x[j + 16];
    float dx, ds;
    std::memcpy(&dx, a + 32, 4);
    std::memcpy(&ds, a + 36, 4);
    acc = std::fma(static_cast<float>(sum), w.dw * dx, acc);
    return std::fma(w.m, ds, acc);
  }
};
#endif

// One weight row's three arrays.
struct WeightRow {
  const uint8_t* quants;
  const uint8_t* scales;
  const uint8_t* mins;
};
struct WeightMatrix {
  const uint8_t* data;
  int64_t k, row_bytes, scales_off, mins_off;
  WeightRow row(int64_t o) const {
    const uint8_t* r = data + o * row_bytes;
    return {r, r + scales_off, r + mins_off};
  }
};

constexpr int kMaxGemvRows = 8;
// GEMV software prefetch distance into L2 (prefetcht1), as the bf16 GEMV's (cpu_linear.cpp):
// one core alone does not keep enough misses in flight to stream from DRAM at full rate.
constexpr int64_t kPrefetchBytes = 16384;

// Decode: outputs [o_begin, o_end) for R rows, one output at a time: its weight steps are
// loaded once and applied to every row. A thread's outputs are consecutive rows of the
// matrix: one sequential weight stream.
template <class K, int R>
void gemv_range(const QuantizedRows& x, const WeightMatrix& w, const float* bias, float* out,
                int64_t n, int64_t o_begin, int64_t o_end) {
  const int64_t steps = (x.k + K::kStep - 1) / K::kStep;
  for (int64_t o = o_begin; o < o_end; ++o) {
    const WeightRow wr = w.row(o);
    const char* pf = reinterpret_cast<const char*>(wr.quants) + kPrefetchBytes;
    for (int64_t p = 0; p < w.row_bytes; p += 64) __builtin_prefetch(pf + p, 0, 2);
    typename K::Acc acc[R];
    for (int r = 0; r < R; ++r) acc[r] = K::zero();
    for (int64_t s = 0; s < steps; ++s) {
      const typename K::W ws = K::load(wr.quants, wr.scales, wr.mins, x.k, s);
      for (int r = 0; r < R; ++r)
        acc[r] = K::step(acc[r], ws, x.data + r * x.row_bytes + s * K::kActStepBytes);
    }
    for (int r = 0; r < R; ++r) {
      float v = K::finish(acc[r]);
      if (bias) v += bias[o];
      out[r * n + o] = v;
    }
  }
}

template <class K, int R>
void gemv(const QuantizedRows& x, const WeightMatrix& w, const float* bias, float* out, int64_t n,
          WorkerPool& pool) {
  constexpr int64_t kChunk = 32;  // outputs per scheduling unit
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const bool parallel = pool.size() > 1 && n * w.row_bytes >= (1 << 15);
  pool.parallel_for(chunks, parallel, [&](int64_t c) {
    gemv_range<K, R>(x, w, bias, out, n, c * kChunk, std::min(n, (c + 1) * kChunk));
  });
}

// Prefill: tiles of kNr outputs x kMr rows with kMr * kNr accumulators in registers; each
// weight step is unpacked once per tile and row block and applied to kMr rows. Threads split
// the output tiles; every thread walks the row chunks (sized to stay in L2) in the same order,
// so a tile's weights (kNr rows, in L1 / L2) serve every row block of the chunk.
constexpr int kMr = 4;
constexpr int kNr = 4;

template <class K>
void gemm_tile(const QuantizedRows& x, const WeightMatrix& w, const float* bias, float* out,
               int64_t n, int64_t r0, int64_t m_valid, int64_t o0, int64_t n_valid) {
  const int64_t steps = (x.k + K::kStep - 1) / K::kStep;
  WeightRow wr[kNr];
  // Outputs past n repeat the last one and rows past the chunk the last row (computed, not
  // stored).
  for (int j = 0; j < kNr; ++j) wr[j] = w.row(o0 + std::min<int64_t>(j, n_valid - 1));
  const uint8_t* xr[kMr];
  for (int i = 0; i < kMr; ++i)
    xr[i] = x.data + (r0 + std::min<int64_t>(i, m_valid - 1)) * x.row_bytes;
  typename K::Acc acc[kMr][kNr];
  for (int i = 0; i < kMr; ++i)
    for (int j = 0; j < kNr; ++j) acc[i][j] = K::zero();
  for (int64_t s = 0; s < steps; ++s) {
    for (int j = 0; j < kNr; ++j) {
      const typename K::W ws = K::load(wr[j].quants, wr[j].scales, wr[j].mins, x.k, s);
      for (int i = 0; i < kMr; ++i)
        acc[i][j] = K::step(acc[i][j], ws, xr[i] + s * K::kActStepBytes);
    }
  }
  for (int64_t i = 0; i < m_valid; ++i) {
    for (int64_t j = 0; j < n_valid; ++j) {
      float v = K::finish(acc[i][j]);
      if (bias) v += bias[o0 + j];
      out[(r0 + i) * n + o0 + j] = v;
    }
  }
}

template <class K>
void gemm(const QuantizedRows& x, const WeightMatrix& w, const float* bias, float* out, int64_t n,
          WorkerPool& pool) {
  static const int64_t chunk_bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return std::max<int64_t>(int64_t{1} << 17, (l2 > 0 ? l2 : int64_t{1} << 20) / 4);
  }();
  const int64_t tiles = (n + kNr - 1) / kNr;
  const int64_t max_rows = std::max<int64_t>(kMr, chunk_bytes / x.row_bytes / kMr * kMr);
  const int64_t chunks = (x.rows + max_rows - 1) / max_rows;
  const int64_t chunk_rows = ((x.rows + chunks - 1) / chunks + kMr - 1) / kMr * kMr;
  pool.run(pool.size() > 1 && tiles > 1 ? pool.size() : 1, [&](int tid, int team) {
    const IndexRange my_tiles = static_block(tiles, tid, team);
    for (int64_t r_begin = 0; r_begin < x.rows; r_begin += chunk_rows) {
      const int64_t r_end = std::min(x.rows, r_begin + chunk_rows);
      for (int64_t tile : my_tiles) {
        const int64_t o0 = tile * kNr, n_valid = std::min<int64_t>(kNr, n - o0);
        for (int64_t r0 = r_begin; r0 < r_end; r0 += kMr)
          gemm_tile<K>(x, w, bias, out, n, r0, std::min<int64_t>(kMr, r_end - r0), o0, n_valid);
      }
    }
  });
}

template <class K>
void linear_with(const QuantizedRows& x, const WeightMatrix& w, const float* bias, float* out,
                 int64_t n, WorkerPool& pool) {
  if (x.rows > kMaxGemvRows) return gemm<K>(x, w, bias, out, n, pool);
  switch (x.rows) {
    case 1:
      return gemv<K, 1>(x, w, bias, out, n, pool);
    case 2:
      return gemv<K, 2>(x, w, bias, out, n, pool);
    case 3:
      return gemv<K, 3>(x, w, bias, out, n, pool);
    case 4:
      return gemv<K, 4>(x, w, bias, out, n, pool);
    case 5:
      return gemv<K, 5>(x, w, bias, out, n, pool);
    case 6:
      return gemv<K, 6>(x, w, bias, out, n, pool);
    case 7:
      return gemv<K, 7>(x, w, bias, out, n, pool);
    case 8:
      return gemv<K, 8>(x, w, bias, out, n, pool);
    default:
      return;  // no rows
  }
}

template <class K>
int64_t act_row_bytes(int64_t k) {
  return (k + K::kStep - 1) / K::kStep * K::kActStepBytes;
}

}  // namespace

QuantizedRows quantize_rows(DType format, const float* x, int64_t rows, int64_t k,
                            WorkerPool& pool) {
  ATTNRES_CHECK(is_block_quantized(format) && k > 0 && k % kQuantBlock == 0,
                "quantized linear: K = " + std::to_string(k) + " is not a multiple of 32");
  QuantizedRows q;
  q.format = format;
  q.rows = rows;
  q.k = k;
  q.row_bytes = format == DType::Q8_B32 ? act_row_bytes<Q8Kernel>(k) : act_row_bytes<Q4Kernel>(k);
  auto* data = reinterpret_cast<uint8_t*>(
      thread_scratch(ScratchSlot::QuantInput,
                     static_cast<size_t>((std::max<int64_t>(rows, 1) * q.row_bytes + 3) / 4)));
  q.data = data;
  pool.parallel_for(rows, pool.size() > 1 && rows * k >= (1 << 16), [&](int64_t r) {
    if (format == DType::Q8_B32) {
      Q8Kernel::quantize_row(x + r * k, k, data + r * q.row_bytes);
    } else {
      Q4Kernel::quantize_row(x + r * k, k, data + r * q.row_bytes);
    }
  });
  return q;
}

void linear_quantized(const QuantizedRows& x, const uint8_t* w, int64_t n, const float* bias,
                      float* out, WorkerPool& pool) {
  WeightMatrix wm{w, x.k, static_cast<int64_t>(quant_row_bytes(x.format, x.k)),
                  static_cast<int64_t>(quant_scales_offset(x.format, x.k)), 0};
  if (x.format == DType::Q8_B32) return linear_with<Q8Kernel>(x, wm, bias, out, n, pool);
  wm.mins_off = static_cast<int64_t>(quant_mins_offset(x.format, x.k));
  linear_with<Q4Kernel>(x, wm, bias, out, n, pool);
}

void embed_quantized(DType format, const uint8_t* table, int64_t d, const int32_t* ids,
                     int64_t t_dim, float* out, WorkerPool& pool) {
  const auto row_bytes = static_cast<int64_t>(quant_row_bytes(format, d));
  pool.parallel_for(t_dim, pool.size() > 1 && t_dim * d >= (1 << 15), [&](int64_t t) {
    dequantize_row(format, table + ids[t] * row_bytes, d, out + t * d);
  });
}

const char* quantized_linear_isa() { return kIsa; }

}  // namespace attnres::cpu
