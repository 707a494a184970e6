// The Q6_K256 linear (cpu_linear_q6.h). The 6-bit weights are rebuilt as bytes
// q = low | high << 4 (0..63), as for Q6_B32 (cpu_linear_q6.cpp), and multiplied, unsigned, by
// the signed activations; each sub-block's sum of 16 products less its 32 sum qx, times the
// sub-block's integer scale, and the block's two added make its exact integer sum, which
// enters the fixed fma chain with the f32 product of the super-block scale and dx.
// - AVX-512 VNNI: the GEMV (up to 8 rows) takes 16 outputs and 4 blocks (half a super-block)
//   at a time. Each output's weights become two vectors with one block per 128-bit lane,
//   dwords interleaved [t 0..3, 16..19, 4..7, 20..23] and [8..11, 24..27, 12..15, 28..31], so
//   that after vpdpbusd with the activations interleaved alike the even dwords of a lane hold
//   partial sums of the block's first sub-block and the odd dwords of its second; the lane
//   reduction keeps the two apart (reduce16_halves), giving per block one vector of 16
//   outputs per sub-block. From 4 rows on it transposes the step's weights to [4 weights]
//   [output] once instead and multiplies them by broadcast activations. The GEMM packs a tile of 32
//   outputs as [block][4 consecutive weights][output] (Q6_B32's panel) with the blocks' scales,
//   once for all rows, so that one vpdpbusd with a broadcast group of 4 activations advances 16
//   outputs of one sub-block; 4 rows x 32 outputs x 2 sub-blocks of sums in registers. Both scale
//   the sub-blocks' sums in f32 (block_sum_f32: exact products, one rounding, the same value as the
//   int32 sum's).
// - Otherwise one output and one row at a time (AVX2's vpmaddubsw, then vpmaddwd with the
//   sub-block scales, or scalar code).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "kernels/cpu/cpu_linear_q6.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/quant_kernel_driver.h"
#include "kernels/cpu/quant_vnni_util.h"
#include "kernels/cpu/thread_scratch.h"

namespace attnres::cpu {
namespace {

constexpr int kB = static_cast<int>(kQuantBlock);
// Blocks of 32 per super-block of 256.
constexpr int kBlocksPerSuper = static_cast<int>(kQuantSuperBlock / kQuantBlock);

using quant_driver::load_u16;

// The matrix w [n, k] as stored (quant_format.h) and the quantized x rows.
struct Operands {
  const QuantizedRows& x;
  const uint8_t* w;
  int64_t n, blocks, row_bytes, highs_off, scales_off, supers_off;
  const float* bias;
  float* out;

  const uint8_t* low(int64_t o) const { return w + o * row_bytes; }
  const uint8_t* high(int64_t o) const { return low(o) + highs_off; }
  // u8 sc[K / 16] and f16 d[K / 256].
  const uint8_t* scales(int64_t o) const { return low(o) + scales_off; }
  const uint8_t* supers(int64_t o) const { return low(o) + supers_off; }
  const uint8_t* xq(int64_t r) const { return x.data + r * x.row_bytes; }
  const float* dx(int64_t r) const { return reinterpret_cast<const float*>(xq(r) + x.k); }
  // 32 x each sub-block's sum of qx.
  const int32_t* c(int64_t r) const { return reinterpret_cast<const int32_t*>(dx(r) + blocks); }
};

// ---------------------------------------------------------------------------------------
// One output and one row at a time (the builds without AVX-512 VNNI).

// sc0 sum_{t<16} q_t qx_t + sc1 sum_{t>=16} q_t qx_t of one block: low[16] (Q4_B32's nibble
// order), high[8], qx[32].
inline int32_t scaled_block_sum(const uint8_t* low, const uint8_t* high, const uint8_t* x, int sc0,
                                int sc1) {
#if defined(__AVX2__)
  const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(low));
  const __m128i nib = _mm_set1_epi8(0x0f);
  const __m256i low4 =
      _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(p, 4), nib), _mm_and_si128(p, nib));
  // The 8 high bytes in each 64-bit lane, shifted so that the bits of weights 8i .. 8i + 7
  // sit at the bottom of 64-bit lane i.
  int64_t h;
  std::memcpy(&h, high, 8);
  const __m256i top =
      _mm256_and_si256(_mm256_srlv_epi64(_mm256_set1_epi64x(h), _mm256_setr_epi64x(0, 2, 4, 6)),
                       _mm256_set1_epi8(3));
  const __m256i wv = _mm256_or_si256(low4, _mm256_slli_epi16(top, 4));
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  // Pairs of products <= 2 * 63 * 127, times a scale <= 255, two of them: within int32 (and
  // no int16 saturation).
  const __m256i scales = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(sc1)),
                                          _mm_set1_epi16(static_cast<int16_t>(sc0)));
  const __m256i s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), scales);
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
#else
  int32_t sum[2] = {0, 0};
  const auto* q = reinterpret_cast<const int8_t*>(x);
  for (int j = 0; j < kB; ++j) {
    const int w = (low[j % 16] >> (j < 16 ? 0 : 4) & 15) | (high[j % 8] >> (2 * (j / 8)) & 3) << 4;
    sum[j / 16] += w * q[j];
  }
  return sc0 * sum[0] + sc1 * sum[1];
#endif
}

float output_row(const Operands& op, int64_t r, int64_t o) {
  const uint8_t* low = op.low(o);
  const uint8_t* high = op.high(o);
  const uint8_t* sc = op.scales(o);
  const uint8_t* d = op.supers(o);
  const uint8_t* xq = op.xq(r);
  const float* dx = op.dx(r);
  const int32_t* c = op.c(r);
  float acc = 0.0f;
  for (int64_t b = 0; b < op.blocks; ++b) {
    const int sc0 = sc[2 * b], sc1 = sc[2 * b + 1];
    const int32_t s = scaled_block_sum(low + 16 * b, high + 8 * b, xq + kB * b, sc0, sc1) -
                      (sc0 * c[2 * b] + sc1 * c[2 * b + 1]);
    const float ds = f16_to_f32(load_u16(d + 2 * (b / kBlocksPerSuper)));
    acc = std::fma(static_cast<float>(s), ds * dx[b], acc);
  }
  return op.bias ? acc + op.bias[o] : acc;
}

[[maybe_unused]] void linear_rowwise(const Operands& op, WorkerPool& pool) {
  quant_driver::rowwise(op.x.rows, op.n, op.row_bytes, op.out, pool,
                        [&](int64_t r, int64_t o) { return output_row(op, r, o); });
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
using vnni::broadcast_word;
using vnni::gather_f16;
using vnni::RegionPrefetch;
using vnni::transpose16;
using vnni::transpose_lanes4;

using quant_driver::kMaxGemvRows;

// f32(I_b) per lane from the two sub-blocks' sums (less their 32 sum qx) s0, s1 and their
// scales sc0, sc1 (as f32): |s_h| <= 16 x 32 x 127 and sc_h <= 255 make each product
// sc_h s_h < 2^24, exact in f32, so the fma rounds the exact I_b once, as the int32 sum's
// conversion would.
inline __m512 block_sum_f32(__m512i s0, __m512 sc0, __m512i s1, __m512 sc1) {
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), sc0, _mm512_mul_ps(_mm512_cvtepi32_ps(s1), sc1));
}

// v[j] (j < 16): int32 lanes of output j, each 128-bit lane holding partial sums of one
// sub-block in its even dwords and of another in its odd ones. lo[L] / hi[L] lane j = the
// sum of v[j]'s 128-bit lane L's even / odd dwords.
inline void reduce16_halves(const __m512i* v, __m512i* lo, __m512i* hi) {
  __m512i t[8], ul[4], uh[4];
  for (int p = 0; p < 8; ++p)  // per 128-bit lane [a_even, b_even, a_odd, b_odd]
    t[p] = _mm512_add_epi32(_mm512_unpacklo_epi32(v[2 * p], v[2 * p + 1]),
                            _mm512_unpackhi_epi32(v[2 * p], v[2 * p + 1]));
  for (int q = 0; q < 4; ++q) {  // per 128-bit lane: outputs 4q .. 4q + 3
    ul[q] = _mm512_unpacklo_epi64(t[2 * q], t[2 * q + 1]);
    uh[q] = _mm512_unpackhi_epi64(t[2 * q], t[2 * q + 1]);
  }
  transpose_lanes4(ul, lo);
  transpose_lanes4(uh, hi);
}

// From kTransposeRows rows on, the step's 6-bit weights are transposed once to [word][output]
// (transpose16, 128 shuffles shared by the rows) and each row's sub-block sums are vpdpbusd
// with broadcast activation words, as in the GEMM, instead of reducing each row's products
// across lanes (reduce16_halves and the interleaves: ~55 shuffles and adds per row). At
// R = 8 that took 0.7-0.85x the time at the 0.6B shapes (on a shared 2-core Zen 4 VM).
constexpr int kTransposeRows = 4;

// ---------------------------------------------------------------------------------------
// GEMV: 16 outputs and 4 blocks per step (K / 256 whole super-blocks: whole steps).
template <int R>
void gemv_group(const Operands& op, int64_t o0) {
  constexpr bool kTransposed = R >= kTransposeRows;
  const int64_t nvalid = std::min<int64_t>(16, op.n - o0);
  // Outputs past n repeat the last one (computed, not stored).
  const uint8_t* rows[16];
  for (int j = 0; j < 16; ++j) rows[j] = op.low(o0 + std::min<int64_t>(j, nvalid - 1));
  const __m512i idx_valid = quant_driver::row_offsets(0, nvalid - 1, op.row_bytes);
  const int64_t steps = op.blocks / 4;
  // The next group's rows (contiguous: low bits, high bits and scales), into L2 a share per
  // step, so that this group's 16 interleaved row streams come from L2.
  const uint8_t* next = op.low(o0) + 16 * op.row_bytes;
  const uint8_t* next_end = op.low(std::min(op.n, o0 + 32));
  RegionPrefetch prefetch(next, std::max(next, next_end), steps);
  const __m512i nib = _mm512_set1_epi8(0x0f);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  const __m512i byte = _mm512_set1_epi32(0xff);
  // Block L's 8 high bytes in both 64-bit halves of 128-bit lane L, then shifted so that the
  // top bits of weights 0..7 / 8..15 (bits 0-1 / 2-3 of each byte; 16..23 / 24..31: bits 4-5 /
  // 6-7) land on bits 4-5 of their byte.
  const __m512i dup = _mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3);
  const __m512i shl_first = _mm512_setr_epi64(4, 2, 4, 2, 4, 2, 4, 2);
  const __m512i shr_second = _mm512_setr_epi64(0, 2, 0, 2, 0, 2, 0, 2);
  // The step's 8 c values (4 blocks x 2 sub-blocks) to dwords 0 and 1 of each block's lane.
  const __m512i c_spread = _mm512_setr_epi32(0, 1, 0, 0, 2, 3, 0, 0, 4, 5, 0, 0, 6, 7, 0, 0);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < steps; ++s) {
    prefetch.step();
    const int64_t b0 = s * 4;
    // Each output's 8 sub-block scales of the step (bytes 8 s .. 8 s + 7) and super-block scale.
    const __m512i g[2] = {_mm512_i32gather_epi32(idx_valid, op.scales(o0) + 8 * s, 1),
                          _mm512_i32gather_epi32(idx_valid, op.scales(o0) + 8 * s + 4, 1)};
    __m512 sc_lo[4], sc_hi[4];
    for (int b = 0; b < 4; ++b) {
      sc_lo[b] =
          _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(g[b / 2], 16 * (b % 2)), byte));
      sc_hi[b] =
          _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(g[b / 2], 16 * (b % 2) + 8), byte));
    }
    const __m512 ds = gather_f16(op.supers(o0) + 2 * (b0 / kBlocksPerSuper), idx_valid);
    // a[j] / e[j], 128-bit lane b: block b0 + b's weights of output j, dwords interleaved
    // [0..3, 16..19, 4..7, 20..23] / [8..11, 24..27, 12..15, 28..31].
    __m512i a[16], e[16];
    for (int j = 0; j < 16; ++j) {
      const __m512i packed = _mm512_loadu_si512(rows[j] + 64 * s);
      const __m512i h = _mm512_permutexvar_epi64(
          dup, _mm512_zextsi256_si512(_mm256_loadu_si256(
                   reinterpret_cast<const __m256i*>(rows[j] + op.highs_off + 32 * s))));
      // (low nibble & 0x0f) | top bits: vpternlogd 0xd8 is (b & c) | (a & ~c), a the top bits.
      const __m512i first = _mm512_ternarylogic_epi32(
          _mm512_and_si512(_mm512_sllv_epi64(h, shl_first), bits45), packed, nib, 0xd8);
      const __m512i second =
          _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srlv_epi64(h, shr_second), bits45),
                                    _mm512_srli_epi16(packed, 4), nib, 0xd8);
      if constexpr (kTransposed) {
        a[j] = first;
        e[j] = second;
      } else {
        a[j] = _mm512_unpacklo_epi32(first, second);
        e[j] = _mm512_unpackhi_epi32(first, second);
      }
    }
    if constexpr (kTransposed) {
      // [word][output]: word 4 b + g of ft / st holds block b0 + b's weights 4g .. 4g + 3 /
      // 16 + 4g .. 16 + 4g + 3 (its first / second sub-block) for 16 outputs.
      __m512i ft[16], st[16];
      transpose16(a, ft);
      transpose16(e, st);
      for (int r = 0; r < R; ++r) {
        const uint8_t* xr = op.xq(r) + 128 * s;
        const int32_t* c = op.c(r) + 2 * b0;
        const float* dx = op.dx(r) + b0;
        for (int b = 0; b < 4; ++b) {
          __m512i s0 = _mm512_set1_epi32(-c[2 * b]), s1 = _mm512_set1_epi32(-c[2 * b + 1]);
          for (int g = 0; g < 4; ++g) {
            s0 = _mm512_dpbusd_epi32(s0, ft[4 * b + g], broadcast_word(xr + kB * b + 4 * g));
            s1 = _mm512_dpbusd_epi32(s1, st[4 * b + g], broadcast_word(xr + kB * b + 16 + 4 * g));
          }
          acc[r] = _mm512_fmadd_ps(block_sum_f32(s0, sc_lo[b], s1, sc_hi[b]),
                                   _mm512_mul_ps(ds, _mm512_set1_ps(dx[b])), acc[r]);
        }
      }
      continue;
    }
    for (int r = 0; r < R; ++r) {
      const uint8_t* xr = op.xq(r) + 128 * s;
      const __m512i x0 = _mm512_loadu_si512(xr), x1 = _mm512_loadu_si512(xr + 64);
      // The four blocks' first halves and second halves, interleaved as the weights.
      const __m512i xlo = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
      const __m512i xhi = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
      const __m512i xa = _mm512_unpacklo_epi32(xlo, xhi);
      const __m512i xe = _mm512_unpackhi_epi32(xlo, xhi);
      // -c of each block's two sub-blocks in dwords 0 (even: first) and 1 (odd: second).
      const __m512i neg_c = _mm512_maskz_permutexvar_epi32(
          0x3333, c_spread,
          _mm512_castsi256_si512(_mm256_sub_epi32(
              _mm256_setzero_si256(),
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(op.c(r) + 2 * b0)))));
      __m512i dot[16], lo[4], hi[4];
      for (int j = 0; j < 16; ++j)
        dot[j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(neg_c, a[j], xa), e[j], xe);
      reduce16_halves(dot, lo, hi);
      const float* dx = op.dx(r) + b0;
      for (int b = 0; b < 4; ++b) {
        acc[r] = _mm512_fmadd_ps(block_sum_f32(lo[b], sc_lo[b], hi[b], sc_hi[b]),
                                 _mm512_mul_ps(ds, _mm512_set1_ps(dx[b])), acc[r]);
      }
    }
  }
  quant_driver::store_group<R>(acc, op.bias, op.out, op.n, o0);
}

template <int R>
void gemv(const Operands& op, WorkerPool& pool) {
  quant_driver::gemv_groups(op.n, op.row_bytes, pool, [&](int64_t o0) { gemv_group<R>(op, o0); });
}

// ---------------------------------------------------------------------------------------
// GEMM: tiles of 32 outputs, packed; 4 rows at a time.
constexpr int kTile = 32;
constexpr int kMr = 4;
// Packed block: 6-bit weights [2 halves of 16 outputs][8 groups of 4 weights][16 outputs][4]
// (1024 bytes), then f32 ds[32] (the super-block scale), then f32 sc[2 sub-blocks][32].
constexpr int64_t kPackedBlock = 1024 + 128 + 256;

void pack_tile(const Operands& op, int64_t o0, uint8_t* panel, RegionPrefetch next) {
  const int64_t nvalid = std::min<int64_t>(kTile, op.n - o0);
  const __m512i byte = _mm512_set1_epi32(0xff);
  for (int half = 0; half < 2; ++half) {
    const __m512i idx = quant_driver::row_offsets(16 * half, nvalid - 1, op.row_bytes);
    for (int64_t b = 0; b < op.blocks; ++b) {
      next.step();
      uint8_t* pb = panel + b * kPackedBlock;
      quant_driver::pack_q6_weights(op.low(o0) + 16 * b, op.high(o0) + 8 * b, idx, pb + half * 512);
      _mm512_store_ps(pb + 1024 + 64 * half,
                      gather_f16(op.supers(o0) + 2 * (b / kBlocksPerSuper), idx));
      // The block's two sub-block scales (the gather's 4 bytes end inside the row: the last
      // block's are followed by the f16 super-block scales).
      const __m512i sc = _mm512_i32gather_epi32(idx, op.scales(o0) + 2 * b, 1);
      _mm512_store_ps(pb + 1152 + 64 * half, _mm512_cvtepi32_ps(_mm512_and_si512(sc, byte)));
      _mm512_store_ps(pb + 1280 + 64 * half,
                      _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(sc, 8), byte)));
    }
  }
}

void gemm_micro(const Operands& op, const uint8_t* panel, int64_t r0, int64_t m_valid, int64_t o0,
                int64_t n_valid) {
  const uint8_t* xq[kMr];
  const float* dx[kMr];
  const int32_t* c[kMr];
  for (int i = 0; i < kMr; ++i) {
    const int64_t r = r0 + std::min<int64_t>(i, m_valid - 1);  // past the end: repeated
    xq[i] = op.xq(r);
    dx[i] = op.dx(r);
    c[i] = op.c(r);
  }
  __m512 acc[kMr][2];
  for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t b = 0; b < op.blocks; ++b) {
    const uint8_t* pb = panel + b * kPackedBlock;
    // sums[i][v][h]: row i, outputs 16 v .. 16 v + 15, sub-block 2 b + h, less its 32 sum qx.
    __m512i sums[kMr][2][2];
    for (int i = 0; i < kMr; ++i)
      for (int v = 0; v < 2; ++v)
        for (int h = 0; h < 2; ++h) sums[i][v][h] = _mm512_set1_epi32(-c[i][2 * b + h]);
    for (int g = 0; g < 4; ++g) {
      __m512i w[2][2];
      for (int v = 0; v < 2; ++v)
        for (int h = 0; h < 2; ++h) w[v][h] = _mm512_load_si512(pb + 512 * v + (g + 4 * h) * 64);
      for (int i = 0; i < kMr; ++i) {
        for (int h = 0; h < 2; ++h) {
          int32_t x4;
          std::memcpy(&x4, xq[i] + kB * b + 16 * h + 4 * g, 4);
          const __m512i xb = _mm512_set1_epi32(x4);
          for (int v = 0; v < 2; ++v)
            sums[i][v][h] = _mm512_dpbusd_epi32(sums[i][v][h], w[v][h], xb);
        }
      }
    }
    for (int v = 0; v < 2; ++v) {
      const __m512 ds = _mm512_load_ps(reinterpret_cast<const float*>(pb + 1024 + 64 * v));
      const __m512 sc0 = _mm512_load_ps(reinterpret_cast<const float*>(pb + 1152 + 64 * v));
      const __m512 sc1 = _mm512_load_ps(reinterpret_cast<const float*>(pb + 1280 + 64 * v));
      for (int i = 0; i < kMr; ++i)
        acc[i][v] = _mm512_fmadd_ps(block_sum_f32(sums[i][v][0], sc0, sums[i][v][1], sc1),
                                    _mm512_mul_ps(ds, _mm512_set1_ps(dx[i][b])), acc[i][v]);
    }
  }
  quant_driver::store_tile<kMr>(acc, op.bias, op.out, op.n, r0, m_valid, o0, n_valid);
}

void gemm(const Operands& op, WorkerPool& pool) {
  quant_driver::gemm_tiles<kTile, kMr>(
      op.n, op.x.rows, op.blocks, op.blocks * kPackedBlock, pool,
      [&](int64_t o) { return op.low(o); },
      [&](int64_t o0, uint8_t* panel, RegionPrefetch next) { pack_tile(op, o0, panel, next); },
      [&](const uint8_t* panel, int64_t r0, int64_t m_valid, int64_t o0, int64_t n_valid) {
        gemm_micro(op, panel, r0, m_valid, o0, n_valid);
      });
}

void linear_vnni(const Operands& op, WorkerPool& pool) {
  if (op.x.rows > kMaxGemvRows) return gemm(op, pool);
  quant_driver::with_gemv_rows(op.x.rows,
                               [&](auto rows) { gemv<decltype(rows)::value>(op, pool); });
}
#endif

}  // namespace

void linear_q6k(const QuantizedRows& x, const uint8_t* w, int64_t n, const float* bias, float* out,
                WorkerPool& pool) {
  ATTNRES_CHECK(x.format == DType::Q6_K256, "linear_q6k on rows quantized for another format");
  if (x.rows == 0) return;
  const Operands op{x,
                    w,
                    n,
                    x.k / kQuantBlock,
                    static_cast<int64_t>(quant_row_bytes(DType::Q6_K256, x.k)),
                    static_cast<int64_t>(quant_highs_offset(DType::Q6_K256, x.k)),
                    static_cast<int64_t>(quant_scales_offset(DType::Q6_K256, x.k)),
                    static_cast<int64_t>(quant_super_scales_offset(DType::Q6_K256, x.k)),
                    bias,
                    out};
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
  linear_vnni(op, pool);
#else
  linear_rowwise(op, pool);
#endif
}

}  // namespace attnres::cpu
