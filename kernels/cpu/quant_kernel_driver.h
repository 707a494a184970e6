// The work split and the output stores every quantized linear kernel shares
// (cpu_linear_quant.cpp, cpu_linear_q6.cpp, cpu_linear_q6k.cpp); each kernel file supplies only
// how it gets its blocks' sums:
// - rowwise: chunks of 32 outputs across threads, each output of each row by output_row;
// - GEMV: groups of 16 outputs across threads in static contiguous ranges (each thread streams
//   one region of the matrix), the row count (1..8) a template argument (with_gemv_rows);
// - GEMM (AVX-512 VNNI builds): tiles of outputs across threads; a thread packs each of its
//   tiles once, the next tile's rows prefetched into L2 meanwhile, and runs every kMr rows
//   through it;
// - store_group / store_tile: a group's or micro-tile's accumulators (+ bias) stored under
//   the mask of the outputs that exist.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/quant_vnni_util.h"
#include "kernels/cpu/thread_scratch.h"
#include "kernels/cpu/worker_pool.h"

namespace attnres::cpu::quant_driver {

// Up to this many rows the kernels run their GEMV, above it the GEMM: the GEMM's gathers from
// DRAM made it 1.3-2x slower at R = 4 and 8 (0.6B shapes, int8 and int4, on a loaded Zen 4 VM).
constexpr int kMaxGemvRows = 8;

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return h;
}

// Whether n outputs of row_bytes stored bytes each are worth the pool's threads.
inline bool worth_threads(const WorkerPool& pool, int64_t n, int64_t row_bytes) {
  return pool.size() > 1 && n * row_bytes >= (1 << 15);
}

// out[r * n + o] = output_row(r, o) for every row r < rows and output o < n.
template <typename OutputRow>
void rowwise(int64_t rows, int64_t n, int64_t row_bytes, float* out, WorkerPool& pool,
             const OutputRow& output_row) {
  constexpr int64_t kChunk = 32;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  pool.parallel_for(chunks, worth_threads(pool, n, row_bytes), [&](int64_t c) {
    for (int64_t o = c * kChunk; o < std::min(n, (c + 1) * kChunk); ++o)
      for (int64_t r = 0; r < rows; ++r) out[r * n + o] = output_row(r, o);
  });
}

// group(o0) for o0 = 0, 16, 32, ... < n.
template <typename Group>
void gemv_groups(int64_t n, int64_t row_bytes, WorkerPool& pool, const Group& group) {
  pool.parallel_for((n + 15) / 16, worth_threads(pool, n, row_bytes),
                    [&](int64_t g) { group(g * 16); });
}

// f(std::integral_constant<int, R>{}) with R = rows, for rows in [1, kMaxGemvRows].
template <typename F>
void with_gemv_rows(int64_t rows, const F& f) {
  switch (rows) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    case 5:
      return f(std::integral_constant<int, 5>{});
    case 6:
      return f(std::integral_constant<int, 6>{});
    case 7:
      return f(std::integral_constant<int, 7>{});
    case 8:
      return f(std::integral_constant<int, 8>{});
    default:
      return;
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
// Lane j: the byte offset of output first + j's stored row from output 0's, the output
// clamped to `last` (outputs past the matrix repeat its last one: computed, not stored).
inline __m512i row_offsets(int first, int64_t last, int64_t row_bytes) {
  const __m512i j =
      _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                       _mm512_set1_epi32(first));
  return _mm512_mullo_epi32(_mm512_min_epi32(j, _mm512_set1_epi32(static_cast<int>(last))),
                            _mm512_set1_epi32(static_cast<int>(row_bytes)));
}

// The GEMM panel's 6-bit weights of one block of 16 outputs (both Q6 formats: Q6_B32's low /
// high layout), gathered at row offsets idx from the block's low bytes low (16 per row) and
// high bytes high (8 per row): dst[64 g + 4 j + t] = weight 4 g + t of output j for g < 4,
// dst[256 + 64 g + 4 j + t] = weight 16 + 4 g + t, each the byte low | high << 4 (0..63).
inline void pack_q6_weights(const uint8_t* low, const uint8_t* high, __m512i idx, uint8_t* dst) {
  const __m512i nib = _mm512_set1_epi8(0x0f), three = _mm512_set1_epi8(3);
  // High bytes 0..3 and 4..7 of the block: byte 4 (g % 2) + t holds the top bits of weights
  // 4g + t (bits 2 (g / 2)) and 16 + 4g + t (bits 4 + 2 (g / 2)), g < 4.
  const __m512i h[2] = {_mm512_i32gather_epi32(idx, high, 1),
                        _mm512_i32gather_epi32(idx, high + 4, 1)};
  for (int g = 0; g < 4; ++g) {
    const __m512i v = _mm512_i32gather_epi32(idx, low + 4 * g, 1);
    const __m512i shift = _mm512_set1_epi32(2 * (g / 2));
    const __m512i top_first = _mm512_and_si512(_mm512_srlv_epi32(h[g % 2], shift), three);
    const __m512i top_second = _mm512_and_si512(
        _mm512_srlv_epi32(h[g % 2], _mm512_add_epi32(shift, _mm512_set1_epi32(4))), three);
    _mm512_store_si512(dst + g * 64,
                       _mm512_or_si512(_mm512_and_si512(v, nib), _mm512_slli_epi16(top_first, 4)));
    _mm512_store_si512(dst + (g + 4) * 64,
                       _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), nib),
                                       _mm512_slli_epi16(top_second, 4)));
  }
}

// out[r * n + o0 + j] = acc[r] lane j (+ bias[o0 + j]) for r < R and the j < 16 outputs that
// exist (o0 + j < n).
template <int R>
inline void store_group(const __m512 (&acc)[R], const float* bias, float* out, int64_t n,
                        int64_t o0) {
  const int64_t nvalid = std::min<int64_t>(16, n - o0);
  const __mmask16 omask = static_cast<__mmask16>((1u << nvalid) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(omask, bias + o0) : _mm512_setzero_ps();
  for (int r = 0; r < R; ++r)
    _mm512_mask_storeu_ps(out + r * n + o0, omask, bias ? _mm512_add_ps(acc[r], b) : acc[r]);
}

// The micro-tile of rows r0 .. r0 + m_valid and outputs o0 .. o0 + n_valid (n_valid <= 32):
// acc[i][v] lane j is row r0 + i, output o0 + 16 v + j.
template <int kMr>
inline void store_tile(const __m512 (&acc)[kMr][2], const float* bias, float* out, int64_t n,
                       int64_t r0, int64_t m_valid, int64_t o0, int64_t n_valid) {
  for (int v = 0; v < 2; ++v) {
    const int64_t lanes = std::clamp<int64_t>(n_valid - 16 * v, 0, 16);
    if (lanes == 0) continue;
    const __mmask16 omask = static_cast<__mmask16>((1u << lanes) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(omask, bias + o0 + 16 * v) : _mm512_setzero_ps();
    for (int64_t i = 0; i < m_valid; ++i)
      _mm512_mask_storeu_ps(out + (r0 + i) * n + o0 + 16 * v, omask,
                            bias ? _mm512_add_ps(acc[i][v], b) : acc[i][v]);
  }
}

// Tiles of kTile outputs split across the pool's threads in static contiguous ranges: per
// tile, pack(o0, panel, prefetch) fills the thread's panel (panel_bytes of its scratch),
// prefetch spreading the next tile's rows (first_byte(o): where output o's stored row starts)
// over the pack's 2 x blocks steps; then micro(panel, r0, m_valid, o0, n_valid) for every kMr
// rows.
template <int kTile, int kMr, typename FirstByte, typename Pack, typename Micro>
void gemm_tiles(int64_t n, int64_t rows, int64_t blocks, int64_t panel_bytes, WorkerPool& pool,
                const FirstByte& first_byte, const Pack& pack, const Micro& micro) {
  const int64_t tiles = (n + kTile - 1) / kTile;
  pool.run(pool.size() > 1 && tiles > 1 ? pool.size() : 1, [&](int tid, int team) {
    auto* panel = reinterpret_cast<uint8_t*>(
        thread_scratch(ScratchSlot::GemmPanel, static_cast<size_t>(panel_bytes / 4)));
    const IndexRange mine = static_block(tiles, tid, team);
    for (int64_t tile : mine) {
      const int64_t o0 = tile * kTile;
      const uint8_t* next = first_byte(std::min(n, o0 + kTile));
      const uint8_t* next_end =
          tile + 1 < mine.end_ ? first_byte(std::min(n, o0 + 2 * kTile)) : next;
      pack(o0, panel, vnni::RegionPrefetch(next, next_end, 2 * blocks));
      for (int64_t r0 = 0; r0 < rows; r0 += kMr)
        micro(panel, r0, std::min<int64_t>(kMr, rows - r0), o0, std::min<int64_t>(kTile, n - o0));
    }
  });
}
#endif

}  // namespace attnres::cpu::quant_driver
