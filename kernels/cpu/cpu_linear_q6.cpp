// The Q6_B32 linear (cpu_linear_q6.h). Each block's 6-bit weights are rebuilt as bytes
// q = low | high << 4 (0..63) and multiplied, unsigned, by the signed activations; the block's
// 32 sum qx is subtracted from the exact integer sum, which then enters the fixed fma chain.
// - AVX-512 VNNI: the GEMV (up to 8 rows) takes 16 outputs and 4 blocks at a time: each
//   output's 64 low-nibble bytes and 32 high-bit bytes become two vectors of 6-bit weights
//   (weights 0..15 and 16..31 of each block, one block per 128-bit lane), multiplied by the
//   activation row with vpdpbusd and reduced across lanes to one vector of 16 outputs per
//   block. The GEMM packs a tile of 32 outputs as [block][4 consecutive weights][output] once
//   for all rows (Q4_B32's panel with 6-bit bytes), so that one vpdpbusd with a broadcast
//   group of 4 activations advances 16 outputs, 6 rows x 32 outputs in registers.
// - Otherwise one output and one row at a time (AVX2's vpmaddubsw, or scalar code).
#include "kernels/cpu/cpu_linear_q6.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/quant_kernel_driver.h"
#include "kernels/cpu/quant_vnni_util.h"
#include "kernels/cpu/thread_scratch.h"

namespace attnres::cpu {
namespace {

constexpr int kB = static_cast<int>(kQuantBlock);

using quant_driver::load_u16;

// The matrix w [n, k] as stored (quant_format.h) and the quantized x rows.
struct Operands {
  const QuantizedRows& x;
  const uint8_t* w;
  int64_t n, blocks, row_bytes, highs_off, scales_off;
  const float* bias;
  float* out;

  const uint8_t* low(int64_t o) const { return w + o * row_bytes; }
  const uint8_t* high(int64_t o) const { return low(o) + highs_off; }
  const uint8_t* scales(int64_t o) const { return low(o) + scales_off; }
  const uint8_t* xq(int64_t r) const { return x.data + r * x.row_bytes; }
  const float* dx(int64_t r) const { return reinterpret_cast<const float*>(xq(r) + x.k); }
  // 32 x each block's sum of qx.
  const int32_t* c(int64_t r) const { return reinterpret_cast<const int32_t*>(dx(r) + blocks); }
};

// ---------------------------------------------------------------------------------------
// One output and one row at a time (the builds without AVX-512 VNNI).

// sum_j q_j qx_j of one block: low[16] (Q4_B32's nibble order), high[8], qx[32].
inline int32_t block_sum(const uint8_t* low, const uint8_t* high, const uint8_t* x) {
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
  // Pairs of products <= 2 * 63 * 127: no int16 saturation.
  const __m256i s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), _mm256_set1_epi16(1));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
#else
  int32_t sum = 0;
  const auto* q = reinterpret_cast<const int8_t*>(x);
  for (int j = 0; j < kB; ++j) {
    const int w = (low[j % 16] >> (j < 16 ? 0 : 4) & 15) | (high[j % 8] >> (2 * (j / 8)) & 3) << 4;
    sum += w * q[j];
  }
  return sum;
#endif
}

float output_row(const Operands& op, int64_t r, int64_t o) {
  const uint8_t* low = op.low(o);
  const uint8_t* high = op.high(o);
  const uint8_t* sc = op.scales(o);
  const uint8_t* xq = op.xq(r);
  const float* dx = op.dx(r);
  const int32_t* c = op.c(r);
  float acc = 0.0f;
  for (int64_t b = 0; b < op.blocks; ++b) {
    const int32_t s = block_sum(low + 16 * b, high + 8 * b, xq + kB * b) - c[b];
    acc = std::fma(static_cast<float>(s), f16_to_f32(load_u16(sc + 2 * b)) * dx[b], acc);
  }
  return op.bias ? acc + op.bias[o] : acc;
}

[[maybe_unused]] void linear_rowwise(const Operands& op, WorkerPool& pool) {
  quant_driver::rowwise(op.x.rows, op.n, op.row_bytes, op.out, pool,
                        [&](int64_t r, int64_t o) { return output_row(op, r, o); });
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
using vnni::gather_f16;
using vnni::reduce16;
using vnni::RegionPrefetch;

using quant_driver::kMaxGemvRows;

// ---------------------------------------------------------------------------------------
// GEMV: 16 outputs and 4 blocks per step.
template <int R>
void gemv_group(const Operands& op, int64_t o0) {
  const int64_t nvalid = std::min<int64_t>(16, op.n - o0);
  // Outputs past n repeat the last one (computed, not stored).
  const uint8_t* rows[16];
  for (int j = 0; j < 16; ++j) rows[j] = op.low(o0 + std::min<int64_t>(j, nvalid - 1));
  const __m512i idx_valid = quant_driver::row_offsets(0, nvalid - 1, op.row_bytes);
  const int64_t steps = (op.blocks + 3) / 4;
  // The next group's rows (contiguous: low bits, high bits and scales), into L2 a share per
  // step, so that this group's 16 interleaved row streams come from L2.
  const uint8_t* next = op.low(o0) + 16 * op.row_bytes;
  const uint8_t* next_end = op.low(std::min(op.n, o0 + 32));
  RegionPrefetch prefetch(next, std::max(next, next_end), steps);
  const __m512i nib = _mm512_set1_epi8(0x0f);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  // Block L's 8 high bytes in both 64-bit halves of 128-bit lane L, then shifted so that the
  // top bits of weights 0..7 / 8..15 (bits 0-1 / 2-3 of each byte; 16..23 / 24..31: bits 4-5 /
  // 6-7) land on bits 4-5 of their byte.
  const __m512i dup = _mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3);
  const __m512i shl_first = _mm512_setr_epi64(4, 2, 4, 2, 4, 2, 4, 2);
  const __m512i shr_second = _mm512_setr_epi64(0, 2, 0, 2, 0, 2, 0, 2);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < steps; ++s) {
    prefetch.step();
    const int64_t b0 = s * 4;
    const int whole = static_cast<int>(std::min<int64_t>(4, op.blocks - b0));
    __m512 dw[4];
    for (int b = 0; b < whole; ++b) dw[b] = gather_f16(op.scales(o0) + 2 * (b0 + b), idx_valid);
    const __mmask64 lmask = whole == 4 ? ~__mmask64{0} : (__mmask64{1} << (16 * whole)) - 1;
    const __mmask32 hmask = whole == 4 ? ~__mmask32{0} : (__mmask32{1} << (8 * whole)) - 1;
    // first[j] / second[j], 128-bit lane b: block b0 + b's weights 0..15 / 16..31 of output j.
    __m512i first[16], second[16];
    for (int j = 0; j < 16; ++j) {
      const __m512i packed = _mm512_maskz_loadu_epi8(lmask, rows[j] + 64 * s);
      const __m512i h = _mm512_permutexvar_epi64(
          dup,
          _mm512_zextsi256_si512(_mm256_maskz_loadu_epi8(hmask, rows[j] + op.highs_off + 32 * s)));
      // (low nibble & 0x0f) | top bits: vpternlogd 0xd8 is (b & c) | (a & ~c), a the top bits.
      first[j] = _mm512_ternarylogic_epi32(
          _mm512_and_si512(_mm512_sllv_epi64(h, shl_first), bits45), packed, nib, 0xd8);
      second[j] =
          _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srlv_epi64(h, shr_second), bits45),
                                    _mm512_srli_epi16(packed, 4), nib, 0xd8);
    }
    for (int r = 0; r < R; ++r) {
      const uint8_t* xr = op.xq(r) + 128 * s;
      const __m512i x0 = _mm512_loadu_si512(xr), x1 = _mm512_loadu_si512(xr + 64);
      // The four blocks' first halves and second halves, lined up with the weights.
      const __m512i xlo = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
      const __m512i xhi = _mm512_shuffle_i64x2(x0, x1, _MM_SHUFFLE(3, 1, 3, 1));
      __m512i dot[16], f[4];
      for (int j = 0; j < 16; ++j)
        dot[j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), first[j], xlo),
                                     second[j], xhi);
      reduce16(dot, f);
      const float* dx = op.dx(r) + b0;
      const int32_t* c = op.c(r) + b0;
      for (int b = 0; b < whole; ++b) {
        const __m512i sum = _mm512_sub_epi32(f[b], _mm512_set1_epi32(c[b]));
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                                 _mm512_mul_ps(dw[b], _mm512_set1_ps(dx[b])), acc[r]);
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
// GEMM: tiles of 32 outputs, packed; 6 rows at a time.
constexpr int kTile = 32;
constexpr int kMr = 6;
// Packed block: 6-bit weights [2 halves of 16 outputs][8 groups of 4 weights][16 outputs][4]
// (1024 bytes), then f32 dw[32].
constexpr int64_t kPackedBlock = 1024 + 128;

void pack_tile(const Operands& op, int64_t o0, uint8_t* panel, RegionPrefetch next) {
  const int64_t nvalid = std::min<int64_t>(kTile, op.n - o0);
  for (int half = 0; half < 2; ++half) {
    const __m512i idx = quant_driver::row_offsets(16 * half, nvalid - 1, op.row_bytes);
    for (int64_t b = 0; b < op.blocks; ++b) {
      next.step();
      uint8_t* pb = panel + b * kPackedBlock;
      quant_driver::pack_q6_weights(op.low(o0) + 16 * b, op.high(o0) + 8 * b, idx, pb + half * 512);
      _mm512_store_ps(pb + 1024 + 64 * half, gather_f16(op.scales(o0) + 2 * b, idx));
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
    __m512i isum[kMr][2];
    for (int i = 0; i < kMr; ++i) isum[i][0] = isum[i][1] = _mm512_set1_epi32(-c[i][b]);
    for (int g = 0; g < 8; ++g) {
      const __m512i w0 = _mm512_load_si512(pb + g * 64);
      const __m512i w1 = _mm512_load_si512(pb + 512 + g * 64);
      for (int i = 0; i < kMr; ++i) {
        int32_t x4;
        std::memcpy(&x4, xq[i] + kB * b + 4 * g, 4);
        const __m512i xb = _mm512_set1_epi32(x4);
        isum[i][0] = _mm512_dpbusd_epi32(isum[i][0], w0, xb);
        isum[i][1] = _mm512_dpbusd_epi32(isum[i][1], w1, xb);
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

void linear_q6(const QuantizedRows& x, const uint8_t* w, int64_t n, const float* bias, float* out,
               WorkerPool& pool) {
  ATTNRES_CHECK(x.format == DType::Q6_B32, "linear_q6 on rows quantized for another format");
  if (x.rows == 0) return;
  const Operands op{x,
                    w,
                    n,
                    x.k / kQuantBlock,
                    static_cast<int64_t>(quant_row_bytes(DType::Q6_B32, x.k)),
                    static_cast<int64_t>(quant_highs_offset(DType::Q6_B32, x.k)),
                    static_cast<int64_t>(quant_scales_offset(DType::Q6_B32, x.k)),
                    bias,
                    out};
#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
  linear_vnni(op, pool);
#else
  linear_rowwise(op, pool);
#endif
}

}  // namespace attnres::cpu
