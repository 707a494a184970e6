// The quantized linear (cpu_linear_quant.h): every output is the fma chain over its blocks
// that the header defines; the kernels differ only in how they get the blocks' integer sums.
// - AVX-512 VNNI: the GEMV takes 16 output rows at a time, multiplies each one's step of 64
//   weight bytes by the activation row with vpdpbusd, and reduces the 16 products' lanes to
//   one vector of 16 outputs per block (reduce16; Q4_B32: vpackssdw / vpmaddwd, its partial
//   sums fit int16); from 4 rows on it transposes the 16 rows' step to [4 weights][output]
//   once and multiplies it by broadcast activations instead. Q8_B32 gathers each block's 16
//   scales; Q4_B32 reads 16 blocks of each row's scales and mins with one load and transposes
//   them (gemv_group_q4); Q4_K256, the same kernel, reads 16 blocks' params (two
//   super-blocks, 32 bytes) of each row with one load, transposes them as words and decodes
//   D and -M for 16 outputs at a time with shifts, masks and f32 products
//   (load_q4k_params). The GEMM packs a tile of 32 outputs ([block][4 consecutive
//   weights][output], gathered; Q4_K256's params decoded as the GEMV's) once for all rows,
//   so that one vpdpbusd with a broadcast group of 4 activations advances 16 outputs, and
//   keeps 6 rows x 32 outputs of block sums and accumulators in registers.
// - Otherwise one output and one row at a time (AVX2's vpmaddubsw for each block's sum, or
//   scalar code; Q4_K256's params decoded a super-block at a time by q4k_block_params).
//
// An activation row (QuantizedRows) is q[K] bytes, then f32 dx[K / 32], then (Q4_B32,
// Q4_K256) f32 dxs[K / 32] = f32(dx * sum qx) (the min term's factor); rows padded to 64
// bytes. Q8_B32 stores qx + 128 (u8: vpdpbusd multiplies unsigned by signed bytes; the
// weights' sums times 128 are subtracted again, exactly), Q4_B32 and Q4_K256 qx itself (the
// weights, 0..15, are the unsigned side).
#include "kernels/cpu/cpu_linear_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "kernels/cpu/cpu_linear_q6.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/quant_kernel_driver.h"
#include "kernels/cpu/quant_vnni_util.h"
#include "kernels/cpu/thread_scratch.h"

namespace attnres::cpu {

float quantize_activation_block(const float* x, int8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int j = 0; j < kQuantBlock; ++j) {
    amax = std::max(amax, std::fabs(x[j]));
    finite = finite && std::isfinite(x[j]);
  }
  if (!finite) {  // NaN scale: the block's outputs become NaN, as an f32 product would
    std::fill(q, q + kQuantBlock, int8_t{0});
    return std::numeric_limits<float>::quiet_NaN();
  }
  const float d = amax / 127.0f;
  for (int j = 0; j < kQuantBlock; ++j) {
    const float v = d == 0.0f ? 0.0f : std::nearbyint(x[j] / d);
    q[j] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
  }
  return d;
}

namespace {

constexpr int kB = static_cast<int>(kQuantBlock);
using quant_driver::kMaxGemvRows;
// Bytes read past an activation row's end by a vector load of a partial step (whose weights
// are zero there): the scratch buffer has this much slack.
constexpr int64_t kActSlack = 256;

using quant_driver::load_u16;

// The matrix w [n, k] as stored (quant_format.h) and the quantized x rows.
struct Operands {
  const QuantizedRows& x;
  const uint8_t* w;
  int64_t n, blocks, row_bytes, scales_off, mins_off;
  const float* bias;
  float* out;
  bool k256;  // Q4_K256: scales_off is the super-block params' (mins_off unused)

  const uint8_t* quants(int64_t o) const { return w + o * row_bytes; }
  const uint8_t* scales(int64_t o) const { return w + o * row_bytes + scales_off; }
  const uint8_t* mins(int64_t o) const { return w + o * row_bytes + mins_off; }
  const uint8_t* xq(int64_t r) const { return x.data + r * x.row_bytes; }
  const float* dx(int64_t r) const { return reinterpret_cast<const float*>(xq(r) + x.k); }
  const float* dxs(int64_t r) const { return dx(r) + blocks; }
};

// ---------------------------------------------------------------------------------------
// One output and one row at a time (the builds without AVX-512 VNNI).

// A block's exact integer sum: Q8_B32 weights w[32] against stored activations xu[32]
// (qx + 128); Q4_B32 packed[16] against qx[32].
inline int32_t block_sum_q8(const uint8_t* w, const uint8_t* xu) {
#if defined(__AVX2__)
  const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m256i xv = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xu)),
                                      _mm256_set1_epi8(static_cast<char>(0x80)));
  // |w| * (x with w's sign): pairs <= 2 * 127 * 127, no int16 saturation.
  const __m256i p = _mm256_madd_epi16(
      _mm256_maddubs_epi16(_mm256_abs_epi8(wv), _mm256_sign_epi8(xv, wv)), _mm256_set1_epi16(1));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
#else
  int32_t sum = 0;
  for (int j = 0; j < kB; ++j) sum += int32_t{static_cast<int8_t>(w[j])} * (int32_t{xu[j]} - 128);
  return sum;
#endif
}

inline int32_t block_sum_q4(const uint8_t* packed, const uint8_t* x) {
#if defined(__AVX2__)
  const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  const __m128i nib = _mm_set1_epi8(0x0f);
  const __m256i wv =
      _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(p, 4), nib), _mm_and_si128(p, nib));
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), _mm256_set1_epi16(1));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
#else
  int32_t sum = 0;
  const auto* q = reinterpret_cast<const int8_t*>(x);
  for (int j = 0; j < 16; ++j)
    sum += int32_t{packed[j] & 0x0f} * q[j] + int32_t{packed[j] >> 4} * q[j + 16];
  return sum;
#endif
}

template <bool kQ4>
float output_row(const Operands& op, int64_t r, int64_t o) {
  const uint8_t* wq = op.quants(o);
  const uint8_t* sc = op.scales(o);
  const uint8_t* xq = op.xq(r);
  const float* dx = op.dx(r);
  float acc = 0.0f;
  BlockScaleMin super[8];  // Q4_K256: the current super-block's blocks, decoded
  for (int64_t b = 0; b < op.blocks; ++b) {
    if constexpr (kQ4) {
      float dw, m;
      if (op.k256) {
        if (b % 8 == 0)  // super-block b / 8's 16 param bytes start at 2 b
          for (int j = 0; j < 8; ++j) super[j] = q4k_block_params(sc + 2 * b, j);
        dw = super[b % 8].d;
        m = super[b % 8].m;
      } else {
        dw = f16_to_f32(load_u16(sc + 2 * b));
        m = f16_to_f32(load_u16(op.mins(o) + 2 * b));
      }
      const int32_t s = block_sum_q4(wq + 16 * b, xq + kB * b);
      acc = std::fma(static_cast<float>(s), dw * dx[b], acc);
      acc = std::fma(m, op.dxs(r)[b], acc);
    } else {
      const float dw = f16_to_f32(load_u16(sc + 2 * b));
      const int32_t s = block_sum_q8(wq + kB * b, xq + kB * b);
      acc = std::fma(static_cast<float>(s), dw * dx[b], acc);
    }
  }
  return op.bias ? acc + op.bias[o] : acc;
}

template <bool kQ4>
void linear_rowwise(const Operands& op, WorkerPool& pool) {
  quant_driver::rowwise(op.x.rows, op.n, op.row_bytes, op.out, pool,
                        [&](int64_t r, int64_t o) { return output_row<kQ4>(op, r, o); });
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
constexpr const char* kIsa = "avx512-vnni";

// ---------------------------------------------------------------------------------------
// GEMV: 16 outputs per group.

using vnni::broadcast_word;
using vnni::gather_f16;
using vnni::reduce16;
using vnni::RegionPrefetch;
using vnni::transpose16;
using vnni::transpose_lanes4;

// From kTransposeRows rows on, the group's weights are transposed once per step to
// [word][output] (64 shuffles, shared by the rows) and each row's block sums are vpdpbusd
// with broadcast activation words, as in the GEMM; below, each row's products are reduced
// across lanes (reduce16: 44 shuffles and adds per row). At R = 8 the transposed form took
// 0.7-1.0x the time (0.6B shapes, both formats, medians of 3 alternated runs on a loaded
// Zen 4 VM), at R = 2 and 4 0.8-1.3x, within that machine's noise.
constexpr int kTransposeRows = 4;

template <bool kQ4, int R>
void gemv_group(const Operands& op, int64_t o0) {
  static_assert(!kQ4, "Q4_B32 runs gemv_group_q4");
  constexpr bool kTransposed = R >= kTransposeRows;
  const int64_t nvalid = std::min<int64_t>(16, op.n - o0);
  // Outputs past n repeat the last one (computed, not stored).
  const uint8_t* rows[16];
  for (int j = 0; j < 16; ++j) rows[j] = op.quants(o0 + std::min<int64_t>(j, nvalid - 1));
  // Byte offsets of the 16 rows from the group's first (the clamped ones too).
  const __m512i idx_valid = quant_driver::row_offsets(0, nvalid - 1, op.row_bytes);
  constexpr int kStepBlocks = 2;
  const int64_t steps = (op.blocks + kStepBlocks - 1) / kStepBlocks;
  const uint8_t* next = op.quants(o0) + 16 * op.row_bytes;
  const uint8_t* next_end = op.quants(std::min(op.n, o0 + 32));
  RegionPrefetch prefetch(next, std::max(next, next_end), steps);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < steps; ++s) {
    prefetch.step();
    const int64_t b0 = s * kStepBlocks;
    const int whole = static_cast<int>(std::min<int64_t>(kStepBlocks, op.blocks - b0));
    __m512 dw[kStepBlocks];
    for (int b = 0; b < whole; ++b) dw[b] = gather_f16(op.scales(o0) + 2 * (b0 + b), idx_valid);
    const __mmask64 qmask = whole == 2 ? ~__mmask64{0} : __mmask64{0xffffffff};
    // Each output's lanes start from -128 x its weights' lane sums, so that vpdpbusd with
    // the stored qx + 128 leaves the exact sums of qw qx.
    const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i w[16], neg_corr[16];
    for (int j = 0; j < 16; ++j) {
      w[j] = _mm512_maskz_loadu_epi8(qmask, rows[j] + 64 * s);
      neg_corr[j] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                     _mm512_dpbusd_epi32(_mm512_setzero_si512(), c128, w[j]));
    }
    if constexpr (kTransposed) {
      // [word][output]: word 8b + g holds block b's weights 4g .. 4g + 3 for 16 outputs.
      __m512i wt[16];
      transpose16(w, wt);
      __m512i init[2];
      const __m512i ones = _mm512_set1_epi8(1);
      for (int b = 0; b < whole; ++b) {
        __m512i sum = _mm512_setzero_si512();
        for (int g = 0; g < 8; ++g) sum = _mm512_dpbusd_epi32(sum, ones, wt[8 * b + g]);
        init[b] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7));
      }
      for (int r = 0; r < R; ++r) {
        const uint8_t* xr = op.xq(r) + 64 * s;
        const float* dx = op.dx(r) + b0;
        for (int b = 0; b < whole; ++b) {
          __m512i sum = init[b];
          for (int g = 0; g < 8; ++g)
            sum = _mm512_dpbusd_epi32(sum, broadcast_word(xr + kB * b + 4 * g), wt[8 * b + g]);
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                                   _mm512_mul_ps(dw[b], _mm512_set1_ps(dx[b])), acc[r]);
        }
      }
      continue;
    }
    for (int r = 0; r < R; ++r) {
      const __m512i xu = _mm512_loadu_si512(op.xq(r) + 64 * s);
      __m512i dot[16], f[4];
      for (int j = 0; j < 16; ++j) dot[j] = _mm512_dpbusd_epi32(neg_corr[j], xu, w[j]);
      reduce16(dot, f);
      const __m512i sums[2] = {_mm512_add_epi32(f[0], f[1]), _mm512_add_epi32(f[2], f[3])};
      const float* dx = op.dx(r) + b0;
      for (int b = 0; b < whole; ++b)
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[b]),
                                 _mm512_mul_ps(dw[b], _mm512_set1_ps(dx[b])), acc[r]);
    }
  }
  quant_driver::store_group<R>(acc, op.bias, op.out, op.n, o0);
}

// Q4_B32 and Q4_K256 GEMV. The 16 rows' f16 scales and mins (Q4_K256: params) are read as
// stored, 16 blocks of a row with one load, and transposed to [block][output] f32 once per 16
// blocks (instead of gathering each block's 16 values across the rows).

// f[b] lane j = the f16 at row[j] + 2 b as f32, for b < nb (<= 16); f[b >= nb] undefined.
inline void load_block_params(const uint8_t* const* row, int nb, __m512* f) {
  // A 512-bit masked load (AVX512BW, no AVX512VL needed) of nb words: nothing past them is read.
  const __mmask32 mask = static_cast<__mmask32>((1u << nb) - 1);
  __m512i v[16], t[16];
  for (int j = 0; j < 16; ++j)
    v[j] = _mm512_castps_si512(
        _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_maskz_loadu_epi16(mask, row[j]))));
  transpose16(v, t);
  for (int b = 0; b < 16; ++b) f[b] = _mm512_castsi512_ps(t[b]);
}

// Q4_K256's params of 16 blocks (two super-blocks, 32 bytes) of each of 16 rows at
// params[j], decoded to D (dw) and -M (m) as [block][output] f32 like load_block_params:
// dw[b] / m[b] lane j = block b's value in row j, for b < nb (8 or 16: one super-block,
// nothing past it read). The rows' 32-bit words are transposed first (24 shuffles), so that
// the decode runs once per block for all 16 outputs; the f32 products are q4k_block_params'
// (exact, so the bits match).
inline void load_q4k_params(const uint8_t* const* params, int nb, __m512* dw, __m512* m) {
  const auto row = [nb](const uint8_t* p) {
    return nb == 16 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                    : _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  };
  // v[i]: row i's 8 words, then row i + 8's; an 8 x 8 transpose of words in each 256-bit half
  // (unpacks within 128-bit lanes, then lanes gathered across u[i] and u[i + 4]).
  __m512i v[8], t[8], u[8], w[8];
  for (int i = 0; i < 8; ++i)
    v[i] = _mm512_inserti64x4(_mm512_castsi256_si512(row(params[i])), row(params[i + 8]), 1);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
  }
  // u[4h + c], 128-bit lane L: rows 4h .. 4h + 3 (L >= 2: + 8), word c (L odd: 4 + c).
  for (int h = 0; h < 2; ++h) {
    u[4 * h] = _mm512_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm512_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm512_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm512_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  const __m512i even = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
  const __m512i odd = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int c = 0; c < 4; ++c) {  // w[c] lane j = row j's word c
    w[c] = _mm512_permutex2var_epi64(u[c], even, u[4 + c]);
    w[4 + c] = _mm512_permutex2var_epi64(u[c], odd, u[4 + c]);
  }
  // Super-block h's words: 4h = f16 d, dmin; 4h + 1, 4h + 2 = blocks 0..3, 4..7's sc_j and
  // mn_j bits 4..5; 4h + 3 = mn_j bits 0..3 (byte j % 4, low nibble for j < 4).
  const __m512i low6 = _mm512_set1_epi32(63), low4 = _mm512_set1_epi32(15);
  const __m512i bits45 = _mm512_set1_epi32(0x30), sign = _mm512_set1_epi32(INT32_MIN);
  for (int h = 0; h < nb / 8; ++h) {
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w[4 * h]));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w[4 * h], 16)));
    for (int j = 0; j < 8; ++j) {
      const __m512i s = _mm512_srli_epi32(w[4 * h + 1 + j / 4], 8 * (j % 4));
      const __m512i sc = _mm512_and_si512(s, low6);
      const __m512i mn = _mm512_or_si512(
          _mm512_and_si512(_mm512_srli_epi32(s, 2), bits45),
          _mm512_and_si512(_mm512_srli_epi32(w[4 * h + 3], 8 * (j % 4) + 4 * (j / 4)), low4));
      dw[8 * h + j] = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
      m[8 * h + j] = _mm512_castsi512_ps(
          _mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dmin, _mm512_cvtepi32_ps(mn))), sign));
    }
  }
}

// Each byte's high nibble (one GFNI affine transform: bits 4..7 to 0..3, where the CPU has
// it; 4-7% faster than a shift and a mask in the R = 1 GEMV from cache).
inline __m512i high_nibbles(__m512i packed) {
#if defined(__GFNI__)
  return _mm512_gf2p8affine_epi64_epi8(packed, _mm512_set1_epi64(0x1020408000000000LL), 0);
#else
  return _mm512_and_si512(_mm512_srli_epi16(packed, 4), _mm512_set1_epi8(0x0f));
#endif
}

// One step (4 blocks) of gemv_group_q4 from kTransposeRows rows: the packed bytes transposed
// once, each row's block sums from broadcast activation words.
template <int R>
[[gnu::always_inline]] inline void q4_step_transposed(const Operands& op,
                                                      const uint8_t* const* rows, int64_t s,
                                                      int whole, __mmask64 qmask, const __m512* dw,
                                                      const __m512* m, __m512* acc) {
  const int64_t b0 = s * 4;
  const __m512i nib = _mm512_set1_epi8(0x0f);
  // The packed bytes as [word][output]: word 4b + g holds block b's weights 4g .. 4g + 3
  // (low nibbles) and 16 + 4g .. (high), for 16 outputs.
  __m512i packed[16], pt[16], lo[16], hi[16];
  for (int j = 0; j < 16; ++j) packed[j] = _mm512_maskz_loadu_epi8(qmask, rows[j] + 64 * s);
  transpose16(packed, pt);
  for (int w = 0; w < 16; ++w) {
    lo[w] = _mm512_and_si512(pt[w], nib);
    hi[w] = high_nibbles(pt[w]);
  }
  for (int r = 0; r < R; ++r) {
    const uint8_t* xr = op.xq(r) + 128 * s;
    const float* dx = op.dx(r) + b0;
    const float* dxs = op.dxs(r) + b0;
    for (int b = 0; b < whole; ++b) {
      __m512i sum = _mm512_setzero_si512();
      for (int g = 0; g < 4; ++g) {
        sum = _mm512_dpbusd_epi32(sum, lo[4 * b + g], broadcast_word(xr + kB * b + 4 * g));
        sum = _mm512_dpbusd_epi32(sum, hi[4 * b + g], broadcast_word(xr + kB * b + 16 + 4 * g));
      }
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw[b], _mm512_set1_ps(dx[b])),
                               acc[r]);
      acc[r] = _mm512_fmadd_ps(m[b], _mm512_set1_ps(dxs[b]), acc[r]);
    }
  }
}

// One step (4 blocks) of gemv_group_q4 for fewer than kTransposeRows rows.
template <int R>
[[gnu::always_inline]] inline void q4_step_rowwise(const Operands& op, const uint8_t* const* rows,
                                                   int64_t s, int whole, __mmask64 qmask,
                                                   const __m512* dw, const __m512* m, __m512* acc) {
  const int64_t b0 = s * 4;
  const __m512i nib = _mm512_set1_epi8(0x0f);
  // Each row's activations: the four blocks' first halves and second halves, lined up
  // with the low and the high nibbles.
  __m512i xlo[R], xhi[R];
  for (int r = 0; r < R; ++r) {
    const uint8_t* xr = op.xq(r) + 128 * s;
    const __m512i x0 = _mm512_loadu_si512(xr), x1 = _mm512_loadu_si512(xr + 64);
    xlo[r] = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
    xhi[r] = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
  }
  // Each output's products, reduced to one sum per block as reduce16 does, with fewer
  // shuffles: a lane of dot holds 8 products of a 4-bit weight and an int8 activation
  // (|lane| <= 8 * 15 * 127 = 15240), so a sum of two lanes fits int16 and each halving
  // packs two vectors to int16 (vpackssdw, exact here) and adds neighbours (vpmaddwd):
  // 2 instructions where reduce16 takes 3. 4 outputs at a time, so that few registers
  // are live (the unpacked weights of 4 outputs, not 16); u[r][q] 128-bit lane b holds
  // block b's sums of outputs 4q .. 4q + 3.
  const __m512i ones = _mm512_set1_epi16(1);
  __m512i u[R][4], sums[R][4];
  for (int q = 0; q < 4; ++q) {
    __m512i lo[4], hi[4];
    for (int i = 0; i < 4; ++i) {
      const __m512i packed = _mm512_maskz_loadu_epi8(qmask, rows[4 * q + i] + 64 * s);
      lo[i] = _mm512_and_si512(packed, nib);
      hi[i] = high_nibbles(packed);
    }
    for (int r = 0; r < R; ++r) {
      __m512i dot[4];
      for (int i = 0; i < 4; ++i)
        dot[i] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[i], xlo[r]),
                                     hi[i], xhi[r]);
      const __m512i t0 = _mm512_madd_epi16(_mm512_packs_epi32(dot[0], dot[1]), ones);
      const __m512i t1 = _mm512_madd_epi16(_mm512_packs_epi32(dot[2], dot[3]), ones);
      u[r][q] = _mm512_madd_epi16(_mm512_packs_epi32(t0, t1), ones);
    }
  }
  for (int r = 0; r < R; ++r) transpose_lanes4(u[r], sums[r]);
  for (int r = 0; r < R; ++r) {
    const float* dx = op.dx(r) + b0;
    const float* dxs = op.dxs(r) + b0;
    for (int b = 0; b < whole; ++b) {
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r][b]),
                               _mm512_mul_ps(dw[b], _mm512_set1_ps(dx[b])), acc[r]);
      acc[r] = _mm512_fmadd_ps(m[b], _mm512_set1_ps(dxs[b]), acc[r]);
    }
  }
}

template <int R>
void gemv_group_q4(const Operands& op, int64_t o0) {
  constexpr bool kTransposed = R >= kTransposeRows;
  constexpr int kChunkBlocks = 16;  // blocks per scale / min transpose: 4 steps
  const int64_t nvalid = std::min<int64_t>(16, op.n - o0);
  // Outputs past n repeat the last one (computed, not stored).
  const uint8_t* rows[16];
  for (int j = 0; j < 16; ++j) rows[j] = op.quants(o0 + std::min<int64_t>(j, nvalid - 1));
  const int64_t steps = (op.blocks + 3) / 4;
  // The group after the next one is prefetched: one group ahead left the first steps of
  // each group waiting on its rows' last lines (GEMV R = 1, 0.6B shapes: 5-15% slower).
  const uint8_t* next = op.quants(std::min(op.n, o0 + 32));
  const uint8_t* next_end = op.quants(std::min(op.n, o0 + 48));
  RegionPrefetch prefetch(next, next_end, steps);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  __m512 dwc[kChunkBlocks], mc[kChunkBlocks];  // the current chunk's scales and mins
  for (int64_t s = 0; s < steps; ++s) {
    prefetch.step();
    const int64_t b0 = s * 4;
    const int whole = static_cast<int>(std::min<int64_t>(4, op.blocks - b0));
    const int cb = static_cast<int>(b0 % kChunkBlocks);  // the step's first block in its chunk
    if (cb == 0) {
      const int nb = static_cast<int>(std::min<int64_t>(kChunkBlocks, op.blocks - b0));
      // Both layouts hold 2 bytes per block: Q4_B32's f16 scales (and mins), Q4_K256's
      // 16-byte super-block params.
      const uint8_t* p[16];
      for (int j = 0; j < 16; ++j) p[j] = rows[j] + op.scales_off + 2 * b0;
      if (op.k256) {
        load_q4k_params(p, nb, dwc, mc);
      } else {
        load_block_params(p, nb, dwc);
        for (int j = 0; j < 16; ++j) p[j] = rows[j] + op.mins_off + 2 * b0;
        load_block_params(p, nb, mc);
      }
    }
    const __mmask64 qmask = whole == 4 ? ~__mmask64{0} : (__mmask64{1} << (16 * whole)) - 1;
    if constexpr (kTransposed)
      q4_step_transposed<R>(op, rows, s, whole, qmask, dwc + cb, mc + cb, acc);
    else
      q4_step_rowwise<R>(op, rows, s, whole, qmask, dwc + cb, mc + cb, acc);
  }
  quant_driver::store_group<R>(acc, op.bias, op.out, op.n, o0);
}

template <bool kQ4, int R>
void gemv(const Operands& op, WorkerPool& pool) {
  quant_driver::gemv_groups(op.n, op.row_bytes, pool, [&](int64_t o0) {
    if constexpr (kQ4)
      gemv_group_q4<R>(op, o0);
    else
      gemv_group<kQ4, R>(op, o0);
  });
}

// ---------------------------------------------------------------------------------------
// GEMM: tiles of 32 outputs, packed; 6 rows at a time.
constexpr int kTile = 32;
constexpr int kMr = 6;  // rows at a time: 12 block sums and 12 accumulators in registers
// Packed block: quants [2 halves of 16 outputs][8 groups of 4 weights][16 outputs][4] (1024
// bytes), f32 dw[32], then Q8_B32: int32 corr[32] (-128 x the block's weight sum), Q4_B32:
// f32 m[32].
constexpr int64_t kPackedBlock = 1024 + 128 + 128;

// next: the next tile's weights, prefetched into L2 a share per block, so that its gathers
// find them there (a hint: no value changes).
template <bool kQ4>
void pack_tile(const Operands& op, int64_t o0, uint8_t* panel, RegionPrefetch next) {
  const int64_t nvalid = std::min<int64_t>(kTile, op.n - o0);
  const __m512i nib = _mm512_set1_epi8(0x0f);
  const __m512i ones = _mm512_set1_epi8(1);
  for (int half = 0; half < 2; ++half) {
    // Byte offsets of the half's 16 rows from the tile's first (outputs past n repeat the
    // last one: computed, not stored).
    const __m512i idx = quant_driver::row_offsets(16 * half, nvalid - 1, op.row_bytes);
    const uint8_t* base = op.quants(o0);
    // Q4_K256: the half's 16 rows' params (outputs past n repeat the last one), decoded 16
    // blocks at a time.
    const uint8_t* params[16];
    for (int j = 0; j < 16; ++j)
      params[j] = op.scales(o0 + std::min<int64_t>(16 * half + j, nvalid - 1));
    __m512 dwc[16], mc[16];
    for (int64_t b = 0; b < op.blocks; ++b) {
      next.step();
      uint8_t* pb = panel + b * kPackedBlock;
      __m512i sum = _mm512_setzero_si512();
      if constexpr (kQ4) {
        for (int g = 0; g < 4; ++g) {  // bytes 4g .. 4g + 3: weights 4g.. (low), 16 + 4g.. (high)
          const __m512i v = _mm512_i32gather_epi32(idx, base + 16 * b + 4 * g, 1);
          _mm512_store_si512(pb + half * 512 + g * 64, _mm512_and_si512(v, nib));
          _mm512_store_si512(pb + half * 512 + (g + 4) * 64,
                             _mm512_and_si512(_mm512_srli_epi16(v, 4), nib));
        }
        if (op.k256) {
          if (b % 16 == 0) {
            const uint8_t* p[16];
            for (int j = 0; j < 16; ++j) p[j] = params[j] + 2 * b;
            load_q4k_params(p, static_cast<int>(std::min<int64_t>(16, op.blocks - b)), dwc, mc);
          }
          _mm512_store_ps(pb + 1024 + 64 * half, dwc[b % 16]);
          _mm512_store_ps(pb + 1152 + 64 * half, mc[b % 16]);
          continue;
        }
        _mm512_store_ps(pb + 1152 + 64 * half, gather_f16(op.mins(o0) + 2 * b, idx));
      } else {
        for (int g = 0; g < 8; ++g) {
          const __m512i v = _mm512_i32gather_epi32(idx, base + kB * b + 4 * g, 1);
          _mm512_store_si512(pb + half * 512 + g * 64, v);
          sum = _mm512_dpbusd_epi32(sum, ones, v);
        }
        // -128 x the block's weight sum per output.
        _mm512_store_si512(pb + 1152 + 64 * half,
                           _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
      }
      _mm512_store_ps(pb + 1024 + 64 * half, gather_f16(op.scales(o0) + 2 * b, idx));
    }
  }
}

template <bool kQ4>
void gemm_micro(const Operands& op, const uint8_t* panel, int64_t r0, int64_t m_valid, int64_t o0,
                int64_t n_valid) {
  const uint8_t* xq[kMr];
  const float* dx[kMr];
  const float* dxs[kMr];
  for (int i = 0; i < kMr; ++i) {
    const int64_t r = r0 + std::min<int64_t>(i, m_valid - 1);  // past the end: repeated
    xq[i] = op.xq(r);
    dx[i] = op.dx(r);
    dxs[i] = op.dxs(r);
  }
  __m512 acc[kMr][2];
  for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < op.blocks; ++b) {
    const uint8_t* pb = panel + b * kPackedBlock;
    __m512i isum[kMr][2];
    for (int v = 0; v < 2; ++v) {
      const __m512i init = kQ4 ? _mm512_setzero_si512() : _mm512_load_si512(pb + 1152 + 64 * v);
      for (int i = 0; i < kMr; ++i) isum[i][v] = init;
    }
    for (int g = 0; g < 8; ++g) {
      const __m512i w0 = _mm512_load_si512(pb + g * 64);
      const __m512i w1 = _mm512_load_si512(pb + 512 + g * 64);
      for (int i = 0; i < kMr; ++i) {
        int32_t x4;
        std::memcpy(&x4, xq[i] + kB * b + 4 * g, 4);
        const __m512i xb = _mm512_set1_epi32(x4);
        if constexpr (kQ4) {
          isum[i][0] = _mm512_dpbusd_epi32(isum[i][0], w0, xb);
          isum[i][1] = _mm512_dpbusd_epi32(isum[i][1], w1, xb);
        } else {
          isum[i][0] = _mm512_dpbusd_epi32(isum[i][0], xb, w0);
          isum[i][1] = _mm512_dpbusd_epi32(isum[i][1], xb, w1);
        }
      }
    }
    const __m512 dw[2] = {_mm512_load_ps(reinterpret_cast<const float*>(pb + 1024)),
                          _mm512_load_ps(reinterpret_cast<const float*>(pb + 1088))};
    for (int i = 0; i < kMr; ++i) {
      const __m512 d = _mm512_set1_ps(dx[i][b]);
      for (int v = 0; v < 2; ++v)
        acc[i][v] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i][v]), _mm512_mul_ps(dw[v], d), acc[i][v]);
    }
    if constexpr (kQ4) {
      const __m512 m[2] = {_mm512_load_ps(reinterpret_cast<const float*>(pb + 1152)),
                           _mm512_load_ps(reinterpret_cast<const float*>(pb + 1216))};
      for (int i = 0; i < kMr; ++i) {
        const __m512 ds = _mm512_set1_ps(dxs[i][b]);
        for (int v = 0; v < 2; ++v) acc[i][v] = _mm512_fmadd_ps(m[v], ds, acc[i][v]);
      }
    }
  }
  quant_driver::store_tile<kMr>(acc, op.bias, op.out, op.n, r0, m_valid, o0, n_valid);
}

template <bool kQ4>
void gemm(const Operands& op, WorkerPool& pool) {
  // Each thread packs a tile once and runs every row through it (the rows' activations, ~K
  // bytes each, come from L2 / L3).
  quant_driver::gemm_tiles<kTile, kMr>(
      op.n, op.x.rows, op.blocks, op.blocks * kPackedBlock, pool,
      [&](int64_t o) { return op.quants(o); },
      [&](int64_t o0, uint8_t* panel, RegionPrefetch next) { pack_tile<kQ4>(op, o0, panel, next); },
      [&](const uint8_t* panel, int64_t r0, int64_t m_valid, int64_t o0, int64_t n_valid) {
        gemm_micro<kQ4>(op, panel, r0, m_valid, o0, n_valid);
      });
}

template <bool kQ4>
void linear_vnni(const Operands& op, WorkerPool& pool) {
  if (op.x.rows > kMaxGemvRows) return gemm<kQ4>(op, pool);
  quant_driver::with_gemv_rows(op.x.rows,
                               [&](auto rows) { gemv<kQ4, decltype(rows)::value>(op, pool); });
}

#elif defined(__AVX2__)
constexpr const char* kIsa = "avx2";
#else
constexpr const char* kIsa = "scalar";
#endif

template <bool kQ4>
void run(const Operands& op, WorkerPool& pool) {
  if (op.x.rows == 0) return;
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
  linear_vnni<kQ4>(op, pool);
#else
  linear_rowwise<kQ4>(op, pool);
#endif
}

}  // namespace

QuantizedRows quantize_rows(DType format, const float* x, int64_t rows, int64_t k,
                            WorkerPool& pool) {
  ATTNRES_CHECK(is_block_quantized(format) && k > 0 && k % kQuantBlock == 0,
                "quantized linear: K = " + std::to_string(k) + " is not a multiple of 32");
  const int64_t blocks = k / kQuantBlock;
  QuantizedRows q;
  q.format = format;
  q.rows = rows;
  q.k = k;
  // Q6_K256: int32 32 x sum qx per sub-block of 16 (cpu_linear_q6.h).
  const bool q6k = format == DType::Q6_K256;
  const int64_t per_block = format == DType::Q8_B32 ? 4 : q6k ? 12 : 8;
  q.row_bytes = (k + per_block * blocks + 63) / 64 * 64;
  auto* data = reinterpret_cast<uint8_t*>(thread_scratch(
      ScratchSlot::QuantInput, static_cast<size_t>((rows * q.row_bytes + kActSlack) / 4)));
  q.data = data;
  const bool q4 = format == DType::Q4_B32 || format == DType::Q4_K256;  // the same rows
  const bool q6 = format == DType::Q6_B32;  // cpu_linear_q6.h: int32 32 x sum qx per block
  pool.parallel_for(rows, pool.size() > 1 && rows * k >= (1 << 16), [&](int64_t r) {
    uint8_t* row = data + r * q.row_bytes;
    auto* dx = reinterpret_cast<float*>(row + k);
    for (int64_t b = 0; b < blocks; ++b) {
      auto* qb = reinterpret_cast<int8_t*>(row + kB * b);
      dx[b] = quantize_activation_block(x + r * k + kB * b, qb);
      if (q4) {
        int32_t sum = 0;
        for (int j = 0; j < kB; ++j) sum += qb[j];
        dx[blocks + b] = dx[b] * static_cast<float>(sum);
      } else if (q6) {
        const int32_t c = 32 * std::accumulate(qb, qb + kB, int32_t{0});
        std::memcpy(dx + blocks + b, &c, 4);
      } else if (q6k) {
        const int32_t c[2] = {32 * std::accumulate(qb, qb + kB / 2, int32_t{0}),
                              32 * std::accumulate(qb + kB / 2, qb + kB, int32_t{0})};
        std::memcpy(dx + blocks + 2 * b, c, 8);
      } else {
        for (int j = 0; j < kB; ++j) row[kB * b + j] = static_cast<uint8_t>(qb[j] + 128);
      }
    }
  });
  return q;
}

void linear_quantized(const QuantizedRows& x, const uint8_t* w, int64_t n, const float* bias,
                      float* out, WorkerPool& pool) {
  if (x.format == DType::Q6_B32) return linear_q6(x, w, n, bias, out, pool);
  if (x.format == DType::Q6_K256) return linear_q6k(x, w, n, bias, out, pool);
  const bool k256 = x.format == DType::Q4_K256;
  const bool q4 = x.format == DType::Q4_B32 || k256;
  const Operands op{x,
                    w,
                    n,
                    x.k / kQuantBlock,
                    static_cast<int64_t>(quant_row_bytes(x.format, x.k)),
                    static_cast<int64_t>(quant_scales_offset(x.format, x.k)),
                    q4 && !k256 ? static_cast<int64_t>(quant_mins_offset(x.format, x.k)) : 0,
                    bias,
                    out,
                    k256};
  if (q4) return run<true>(op, pool);
  run<false>(op, pool);
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
