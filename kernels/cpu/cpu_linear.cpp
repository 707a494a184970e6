// linear: out[r, o] = sum_k x[r, k] * w[o, k] (+ bias[o]).  x [R, K] f32, w [N, K] stored as
// F32 / BF16 / F16 (row-major, each output's weights contiguous), out [R, N] f32.
// With bf16 linear inputs on (CpuBackend::set_bf16_linear_inputs) and bf16 weights, x is
// first rounded to bf16 and every dot product is Bf16Dot's (vdpbf16ps); otherwise F32Dot's
// (cpu_linear_dot.h). The kernels below are written once over that policy D.
// Block-quantized weights (quant_format.h) go to cpu_linear_quant.h's kernels instead.
//
// Two regimes, two kernels, one arithmetic:
// - Decode (R <= 8) is memory-bound: every weight byte is read once per step and the x rows
//   (R * K * 4 bytes) live in L1/L2. The GEMV streams each weight row once for all R input
//   rows: a block of O output rows is converted to f32 in registers and FMA'd against the R
//   x vectors into O * R accumulators (O chosen so that O * R independent FMA chains hide the
//   FMA latency). Threads split the output rows in contiguous static chunks.
// - Prefill (R > 8) is compute-bound: the packed GEMM below widens each tile of outputs once
//   and reuses it across a chunk of rows from registers and L1.
// Both compute every output element the same way (kLanes lane-wise chains of D's steps over
// k in order, one fixed hsum tree, the scalar tail, the bias), so a row's result never depends on
// how many rows share the call: prefill rounds exactly like decoding token by token, and a
// request's logits do not depend on its batch-mates (batch invariance, issue #19).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_linear_dot.h"
#include "kernels/cpu/cpu_linear_quant.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/thread_scratch.h"

namespace attnres {
namespace {

using cpu::kLanes;
using cpu::VecF;

constexpr int kMaxGemvRows = 8;
constexpr int64_t kPrefetchBytes = 32768;  // GEMV software-prefetch distance (at least)

// Whether a GEMV of R rows reads its weights one output row at a time with no software
// prefetch: one input row over bf16 weights with bf16 inputs (Bf16Dot, decode on a bf16
// checkpoint). A thread's outputs are consecutive weight rows, so it then reads one
// sequential stream, which the hardware prefetchers follow on their own. Zen 4, 2 threads,
// cold weights (docs/perf-log/cpu-engine.md, "Decode's GEMV as one stream per thread"): 33-49 GB/s
// against 28-41 with 8 rows in lockstep and the software prefetch below, which reads 8
// streams 2 KB apart and needs it (17-31 GB/s without).
template <class D>
constexpr bool gemv_one_stream(int r) {
  return r == 1 && D::kOneRowAtATime;
}

// Output rows handled per GEMV iteration for R input rows: keeps O * R >= 8 FMA chains in
// flight (two FMA units, four cycles each) and, for one row, 8 weight streams; one where the
// rows are read one at a time (gemv_one_stream).
template <class D>
constexpr int gemv_outputs_per_step(int r) {
  return gemv_one_stream<D>(r) ? 1 : r <= 1 ? 8 : r <= 4 ? 2 : 1;
}

// out[r, o] for o in [o_begin, o_end), O outputs at a time. Whatever O, each output is one
// chain of D's steps over k in order, then hsum, the tail and the bias: the same bits.
template <class D, int R, int O, bool SoftwarePrefetch>
void gemv_block(const typename D::XT* x, int64_t k_dim, const typename D::WT* w, const float* bias,
                float* out, int64_t n_dim, int64_t o_begin, int64_t o_end) {
  // SoftwarePrefetch: into L2 (prefetcht1) a fixed distance ahead in the contiguous weight
  // stream: a core alone cannot keep enough misses in flight to use DRAM's bandwidth over O
  // interleaved rows. Measured on a 2-core Xeon (docs/perf-log/cpu-engine.md, issue #19): 32 KB
  // ahead into L2 streams 26-27 GB/s from DRAM against 17-22 without, while 4 KB ahead with
  // prefetchnta (into L1) is slower than none, its line-fill buffers being the limit. Each line is
  // asked for twice: one prefetch per 32 bytes of a step (a prefetch the L2 drops while its miss
  // queue is full gets a second chance). With one per line, Bf16Dot's 64-byte steps streamed 7-10%
  // slower than F32Dot's 32-byte ones on Zen 4 (issue #19).
  using WT = typename D::WT;
  constexpr int64_t kStepBytes = D::kStep * static_cast<int64_t>(sizeof(WT));
  constexpr int64_t kPrefetches = std::max<int64_t>(1, kStepBytes / 32);
  const int64_t block_elems = O * k_dim;
  const int64_t ahead =
      block_elems * std::max<int64_t>(1, kPrefetchBytes / (block_elems * sizeof(WT)));
  int64_t o = o_begin;
  for (; o + O <= o_end; o += O) {
    VecF acc[O][R];
    for (int j = 0; j < O; ++j)
      for (int r = 0; r < R; ++r) acc[j][r] = cpu::vzero();
    const typename D::WT* wrow[O];
    for (int j = 0; j < O; ++j) wrow[j] = w + (o + j) * k_dim;
    int64_t k = 0;
    for (; k + D::kStep <= k_dim; k += D::kStep) {
      typename D::XVec xv[R];
      for (int r = 0; r < R; ++r) xv[r] = D::load_x(x + r * k_dim + k);
      for (int j = 0; j < O; ++j) {
        if constexpr (SoftwarePrefetch) {
          for (int64_t p = 0; p < kPrefetches; ++p)
            __builtin_prefetch(wrow[j] + k + ahead + p * (64 / sizeof(WT)), 0, 2);
        }
        const typename D::WVec wv = D::load_w(wrow[j] + k);
        for (int r = 0; r < R; ++r) acc[j][r] = D::dot(acc[j][r], wv, xv[r]);
      }
    }
    for (int j = 0; j < O; ++j) {
      for (int r = 0; r < R; ++r) {
        float s = cpu::hsum(acc[j][r]);
        // Explicit fma (D::tail), not `s += a * b`: whether the compiler contracts that may
        // differ between instantiations, and every R must round identically (batch invariance).
        for (int64_t kk = k; kk < k_dim; ++kk) s = D::tail(s, wrow[j] + kk, x + r * k_dim + kk);
        if (bias) s += bias[o + j];
        out[r * n_dim + o + j] = s;
      }
    }
  }
  if constexpr (O > 1) {
    if (o < o_end) gemv_block<D, R, 1, SoftwarePrefetch>(x, k_dim, w, bias, out, n_dim, o, o_end);
  }
}

template <class D, int R>
void gemv(const typename D::XT* x, int64_t k_dim, const typename D::WT* w, const float* bias,
          float* out, int64_t n_dim, cpu::WorkerPool& pool) {
  constexpr int64_t kChunk = 32;  // output rows per scheduling unit (a multiple of every O)
  const int64_t chunks = (n_dim + kChunk - 1) / kChunk;
  const bool parallel = pool.size() > 1 && n_dim * k_dim >= (1 << 15);
  pool.parallel_for(chunks, parallel, [&](int64_t c) {
    int64_t begin = c * kChunk, end = std::min(n_dim, begin + kChunk);
    gemv_block<D, R, gemv_outputs_per_step<D>(R), !gemv_one_stream<D>(R)>(x, k_dim, w, bias, out,
                                                                          n_dim, begin, end);
  });
}

// Prefill (R > 8): the GEMV's arithmetic, blocked for reuse. Each output element is computed
// exactly as gemv_block computes it (kLanes lane-wise chains of D's steps over k in order,
// hsum, the scalar tail, then the bias), so a row's result is bit for bit the same as when it
// is decoded alone: batch-invariant by construction, whatever R, the tiling or the thread
// count. The speed comes from reuse, not from reordering the sums: a tile of kNr outputs is
// shared by every row of a row chunk; a microkernel keeps kMr x kNr accumulators in
// registers, loading kMr x vectors and kNr weight vectors per k step (AVX-512: 24 FMAs or
// vdpbf16ps for 11 loads). F32Dot packs the tile once into a panel ([k step][output][step's
// elements]), widened to f32 there; Bf16Dot reads the kNr weight rows where they are
// stored, since its panel would be a plain copy (reading them in place: +5-15% in
// bench_cpu_kernels gemm, docs/BENCHMARKS.md). Row chunks keep x in L2.
// The microkernel's tile: kMr input rows x kNr outputs.
// kBlockElems: the k elements of a block, the panel's share that every row block of a chunk
// uses before the next (kNr x kBlockElems weights; 12 KB for F32Dot, in L1). Between blocks a
// row block's kMr x kNr accumulators go to `partials` and come back: the same bits, but a
// store and a load per accumulator.
template <class D>
struct Tile {
  static constexpr int kMr = kLanes >= 16 ? 4 : 3;
  static constexpr int kNr = kLanes >= 16 ? 6 : 4;
  static constexpr int64_t kBlockElems = 512;
};
#if defined(__AVX512BF16__)
// Bf16Dot: 3 x 8, whose 24 sums leave hsum16 as whole rows of 8 outputs (store_whole_tile).
// With 4 x 6 the scalar epilogue (sums, bias, stores one by one) took ~40% of the
// microkernel's samples at K = 512, where a dot product is only 16 steps (perf annotate).
template <>
struct Tile<cpu::Bf16Dot> {
  static constexpr int kMr = 3;
  static constexpr int kNr = 8;
  // 4096: unblocked up to K = 4096. Zen 4 streams the weight rows from L2 as fast as the
  // microkernel multiplies, and the spills cost more: against 512, +10-20% at K = 1024..3072
  // (bench_cpu_kernels gemm, alternated; 1024 and 2048 in between, docs/BENCHMARKS.md).
  static constexpr int64_t kBlockElems = 4096;
};

// The finished sums of a whole 3 x 8 tile without a scalar tail, through hsum16 (bit for bit
// hsum per accumulator) and 8-wide stores: rows 0 and 1 are one hsum16's two halves, row 2 the
// low half of another. bias, when given, is added lane by lane (the same add as the scalar
// path's).
template <int kMr>
void store_whole_tile(const VecF (&acc)[kMr][8], const float* bias, int64_t o0, float* out,
                      int64_t n_dim) {
  const VecF b = bias ? _mm512_broadcast_f32x8(_mm256_loadu_ps(bias + o0)) : cpu::vzero();
  for (int i = 0; i < kMr; i += 2) {
    VecF pair[16];
    for (int j = 0; j < 8; ++j) {
      pair[j] = acc[i][j];
      pair[8 + j] = i + 1 < kMr ? acc[i + 1][j] : cpu::vzero();
    }
    VecF sums = cpu::hsum16(pair);
    if (bias) sums = cpu::vadd(sums, b);
    _mm256_storeu_ps(out + i * n_dim + o0, _mm512_castps512_ps256(sums));
    if (i + 1 < kMr)
      _mm256_storeu_ps(out + (i + 1) * n_dim + o0,
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sums), 1)));
  }
}
#endif

// x bytes per row chunk: half of this core's L2, so that the chunk stays there next to the
// panel, the out rows and the next tile's prefetched weights. 1 MiB on a 2-MiB-L2 Xeon; on
// Zen 4's 1 MiB L2 a 1 MiB chunk ran the [512 x 1024] x [1024 x 3072] bf16 GEMM 10-13% slower
// than 512 KiB (bench_cpu_kernels gemm, alternated).
int64_t chunk_bytes() {
  static const int64_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return std::max<int64_t>(int64_t{1} << 18, (l2 > 0 ? l2 : int64_t{1} << 20) / 2);
  }();
  return bytes;
}

// One microkernel call: k steps [s0, s1) for input rows xr[0 .. kMr) and the kNr outputs of
// `panel`, with kMr x kNr lane-wise accumulators in registers. They start from zero when s0
// is 0, else from `partial` (where the previous k block left them); after the last k block
// they are finished with the same steps, in the same order, as the end of gemv_block (hsum,
// the scalar tail, the bias) into out rows 0 .. m_valid, outputs o0 .. o0 + n_valid;
// otherwise they are saved to `partial`. Splitting k into blocks this way changes nothing:
// every lane still accumulates its k in order.
// The tile's weights as the microkernel reads them: a packed panel ([k step][output][step's
// elements], PanelT), or (DirectRows) the kNr weight rows where they are stored.
template <class D>
struct PackedPanel {
  const typename D::PanelT* panel;
  typename D::WVec load(int64_t s, int j) const {
    return D::load_panel(panel + (s * Tile<D>::kNr + j) * D::kStep);
  }
};
template <class D>
struct DirectRows {
  const typename D::WT* rows[Tile<D>::kNr];
  typename D::WVec load(int64_t s, int j) const { return D::load_w(rows[j] + s * D::kStep); }
};

template <class D, class Panel>
void gemm_micro(const typename D::XT* const* xr, const Panel& panel, int64_t s0, int64_t s1,
                int64_t ksteps, float* partial, int64_t k_dim, const typename D::WT* w,
                const float* bias, int64_t o0, int64_t m_valid, int64_t n_valid, float* out,
                int64_t n_dim) {
  constexpr int kMr = Tile<D>::kMr, kNr = Tile<D>::kNr;
  VecF acc[kMr][kNr];
  for (int i = 0; i < kMr; ++i)
    for (int j = 0; j < kNr; ++j)
      acc[i][j] = s0 == 0 ? cpu::vzero() : cpu::vload(partial + (i * kNr + j) * kLanes);
  const typename D::XT* xp[kMr];
  for (int i = 0; i < kMr; ++i) xp[i] = xr[i];
  for (int64_t s = s0; s < s1; ++s) {
    typename D::XVec xv[kMr];
    for (int i = 0; i < kMr; ++i) xv[i] = D::load_x(xp[i] + s * D::kStep);
    for (int j = 0; j < kNr; ++j) {
      const typename D::WVec wv = panel.load(s, j);
      for (int i = 0; i < kMr; ++i) acc[i][j] = D::dot(acc[i][j], wv, xv[i]);
    }
  }
  if (s1 < ksteps) {
    for (int i = 0; i < kMr; ++i)
      for (int j = 0; j < kNr; ++j) cpu::vstore(partial + (i * kNr + j) * kLanes, acc[i][j]);
    return;
  }
  const int64_t k_tail = ksteps * D::kStep;
#if defined(__AVX512BF16__)
  if constexpr (kNr == 8) {
    if (m_valid == kMr && n_valid == kNr && k_tail == k_dim) {
      return store_whole_tile<kMr>(acc, bias, o0, out, n_dim);
    }
  }
#endif
  float sums[kMr * kNr];
  cpu::hsum_many(&acc[0][0], kMr * kNr, sums);
  for (int64_t i = 0; i < m_valid; ++i) {
    for (int64_t j = 0; j < n_valid; ++j) {
      float s = sums[i * kNr + j];
      const typename D::WT* wrow = w + (o0 + j) * k_dim;
      for (int64_t kk = k_tail; kk < k_dim; ++kk) s = D::tail(s, wrow + kk, xr[i] + kk);
      if (bias) s += bias[o0 + j];
      out[i * n_dim + o0 + j] = s;
    }
  }
}

// Packs the whole steps of w[o0 .. o0 + kNr, 0 .. ksteps * kStep) into panel[s][j][element]
// (zero for outputs >= n_dim). Exact: bf16 and f16 widen to f32 exactly.
template <class D>
void pack_panel(const typename D::WT* w, int64_t k_dim, int64_t n_dim, int64_t o0, int64_t ksteps,
                typename D::PanelT* panel) {
  constexpr int kNr = Tile<D>::kNr;
  for (int j = 0; j < kNr; ++j) {
    const bool valid = o0 + j < n_dim;
    const typename D::WT* src = w + (o0 + j) * k_dim;
    for (int64_t s = 0; s < ksteps; ++s) {
      typename D::PanelT* dst = panel + (s * kNr + j) * D::kStep;
      if (valid) {
        D::pack(src + s * D::kStep, dst);
      } else {
        D::pack_zero(dst);
      }
    }
  }
}

// Microkernel calls per tile and row chunk: the k blocks times the chunk's row blocks of kMr.
int64_t micro_calls_per_tile(int64_t ksteps, int64_t block_steps, int64_t chunk_rows, int kMr) {
  return (std::max<int64_t>(ksteps, 1) + block_steps - 1) / block_steps *
         ((chunk_rows + kMr - 1) / kMr);
}

// The next tile's weight rows, prefetched into L2 a few cache lines per microkernel call of
// this tile, so that pack_panel (or Bf16Dot's microkernel, which reads them in place) finds
// them there. Without it pack_panel read every tile's rows from DRAM with nothing overlapping
// the wait (a 0.6B forward streams 1.2 GB of weights past the caches); with it prefill was
// 4-10% faster (medians over three alternated rounds, docs/BENCHMARKS.md). Only a hint: no
// value changes.
class NextPanelPrefetch {
 public:
  // Weight rows [o0, o1) (none when o0 == o1) of w [N, k_dim], over `calls` steps.
  template <typename T>
  NextPanelPrefetch(const T* w, int64_t k_dim, int64_t o0, int64_t o1, int64_t calls)
      : line_(reinterpret_cast<const char*>(w + o0 * k_dim)),
        end_(reinterpret_cast<const char*>(w + o1 * k_dim)) {
    const int64_t lines = (end_ - line_ + kLine - 1) / kLine;
    per_call_ = calls > 0 ? (lines + calls - 1) / calls : lines;
  }
  void step() {
    for (int64_t i = 0; i < per_call_ && line_ < end_; ++i, line_ += kLine)
      __builtin_prefetch(line_, 0, 2);  // prefetcht1: L2 (pack_panel reads each line once)
  }

 private:
  static constexpr int64_t kLine = 64;
  const char* line_;
  const char* end_;
  int64_t per_call_ = 0;
};

// A thread_scratch buffer of at least n elements of T (a whole number of floats).
template <typename T>
T* scratch_of(cpu::ScratchSlot slot, int64_t n) {
  const size_t bytes = static_cast<size_t>(std::max<int64_t>(1, n)) * sizeof(T);
  return reinterpret_cast<T*>(
      cpu::thread_scratch(slot, (bytes + sizeof(float) - 1) / sizeof(float)));
}

template <class D>
void gemm(const typename D::XT* x, int64_t r_dim, int64_t k_dim, const typename D::WT* w,
          const float* bias, float* out, int64_t n_dim, cpu::WorkerPool& pool) {
  constexpr int kMr = Tile<D>::kMr, kNr = Tile<D>::kNr;
  const int64_t ksteps = k_dim / D::kStep;
  const int64_t block_steps = Tile<D>::kBlockElems / D::kStep;
  const int64_t tiles = (n_dim + kNr - 1) / kNr;
  const int64_t row_bytes = k_dim * static_cast<int64_t>(sizeof(typename D::XT));
  // The fewest chunks that fit, of equal size (a last chunk of a few rows would pack every
  // panel once more for little work).
  const int64_t max_rows = std::max<int64_t>(kMr, chunk_bytes() / row_bytes / kMr * kMr);
  const int64_t chunks = (r_dim + max_rows - 1) / max_rows;
  const int64_t chunk_rows = ((r_dim + chunks - 1) / chunks + kMr - 1) / kMr * kMr;
  const bool parallel = pool.size() > 1 && tiles > 1;
  // Threads split the output tiles (each packs only its own panels); every thread walks the
  // row chunks in the same order, so the chunk a thread works on is in its own L2.
  pool.run(parallel ? pool.size() : 1, [&](int tid, int team) {
    // Per-thread and cache-line aligned (thread_scratch.h: a heap block's placement cost up
    // to 12%).
    auto* panel = D::kPackFree ? nullptr
                               : scratch_of<typename D::PanelT>(cpu::ScratchSlot::GemmPanel,
                                                                ksteps * kNr * D::kStep);
    float* partials =
        cpu::thread_scratch(cpu::ScratchSlot::GemmPartials,
                            static_cast<size_t>((chunk_rows / kMr) * kMr * kNr * kLanes));
    const cpu::IndexRange my_tiles = cpu::static_block(tiles, tid, team);
    for (int64_t r_begin = 0; r_begin < r_dim; r_begin += chunk_rows) {
      const int64_t r_end = std::min(r_dim, r_begin + chunk_rows);
      for (int64_t tile : my_tiles) {
        const int64_t o0 = tile * kNr, n_valid = std::min<int64_t>(kNr, n_dim - o0);
        PackedPanel<D> packed{panel};
        DirectRows<D> direct;
        if constexpr (D::kPackFree) {
          // Rows past n_dim repeat the last one (computed, not stored).
          for (int j = 0; j < kNr; ++j) direct.rows[j] = w + std::min(o0 + j, n_dim - 1) * k_dim;
        } else {
          pack_panel<D>(w, k_dim, n_dim, o0, ksteps, panel);
        }
        // The thread's next tile: the following one, or its first again for the next chunk.
        const int64_t next_tile = tile + 1 < my_tiles.end_ ? tile + 1
                                  : r_end < r_dim          ? my_tiles.begin_
                                                           : -1;
        const int64_t next_o0 = next_tile < 0 ? n_dim : next_tile * kNr;
        NextPanelPrefetch next(w, k_dim, next_o0, std::min(n_dim, next_o0 + kNr),
                               micro_calls_per_tile(ksteps, block_steps, r_end - r_begin, kMr));
        // k blocks outermost, so the panel's block stays in L1 while every row block of the
        // chunk uses it.
        for (int64_t s0 = 0; s0 < std::max<int64_t>(ksteps, 1); s0 += block_steps) {
          const int64_t s1 = std::min(ksteps, s0 + block_steps);
          for (int64_t r0 = r_begin; r0 < r_end; r0 += kMr) {
            // Rows past the end repeat the last one (computed, not stored).
            const typename D::XT* xr[kMr];
            for (int i = 0; i < kMr; ++i) xr[i] = x + std::min(r0 + i, r_end - 1) * k_dim;
            float* partial = partials + (r0 - r_begin) * kNr * kLanes;
            next.step();
            if constexpr (D::kPackFree) {
              gemm_micro<D>(xr, direct, s0, s1, ksteps, partial, k_dim, w, bias, o0,
                            std::min<int64_t>(kMr, r_end - r0), n_valid, out + r0 * n_dim, n_dim);
            } else {
              gemm_micro<D>(xr, packed, s0, s1, ksteps, partial, k_dim, w, bias, o0,
                            std::min<int64_t>(kMr, r_end - r0), n_valid, out + r0 * n_dim, n_dim);
            }
          }
        }
      }
    }
  });
}

template <class D>
void linear_rows(const typename D::XT* x, int64_t r_dim, int64_t k_dim, const void* w_data,
                 const float* bias, float* out, int64_t n_dim, cpu::WorkerPool& pool) {
  const auto* w = static_cast<const typename D::WT*>(w_data);
  if (k_dim == 0) {  // empty dot products: out = bias (or 0)
    for (int64_t r = 0; r < r_dim; ++r)
      for (int64_t o = 0; o < n_dim; ++o) out[r * n_dim + o] = bias ? bias[o] : 0.0f;
    return;
  }
  if (r_dim > kMaxGemvRows) return gemm<D>(x, r_dim, k_dim, w, bias, out, n_dim, pool);
  switch (r_dim) {
    case 1:
      return gemv<D, 1>(x, k_dim, w, bias, out, n_dim, pool);
    case 2:
      return gemv<D, 2>(x, k_dim, w, bias, out, n_dim, pool);
    case 3:
      return gemv<D, 3>(x, k_dim, w, bias, out, n_dim, pool);
    case 4:
      return gemv<D, 4>(x, k_dim, w, bias, out, n_dim, pool);
    case 5:
      return gemv<D, 5>(x, k_dim, w, bias, out, n_dim, pool);
    case 6:
      return gemv<D, 6>(x, k_dim, w, bias, out, n_dim, pool);
    case 7:
      return gemv<D, 7>(x, k_dim, w, bias, out, n_dim, pool);
    case 8:
      return gemv<D, 8>(x, k_dim, w, bias, out, n_dim, pool);
    default:
      return;  // r_dim == 0: nothing to do
  }
}

#if defined(__AVX512BF16__)
// x rounded to bf16 (f32_to_bf16) in the calling thread's scratch, for Bf16Dot's linear:
// R x K roundings against R x K x N multiply-adds. The rows are split over the threads from
// 64 rows on. linear_many and linear_swiglu round once for all their weights.
const uint16_t* round_inputs(const float* x, int64_t r_dim, int64_t k_dim, cpu::WorkerPool& pool) {
  uint16_t* xb = scratch_of<uint16_t>(cpu::ScratchSlot::LinearInput, r_dim * k_dim);
  pool.parallel_for(r_dim, pool.size() > 1 && r_dim >= 64,
                    [&](int64_t r) { cpu::store_row_bf16(xb + r * k_dim, x + r * k_dim, k_dim); });
  return xb;
}
#endif

// One linear's sizes, x [R, K] (f32, or bf16 rows written by their producer:
// CpuBackend::linear_input_dtype), w [N, K] and out [R, N], and its bias as f32 (widened into
// `widened` when stored narrower), or null. Not copyable: bias may point into `widened` (a
// move keeps its buffer).
struct LinearOperands {
  int64_t r_dim = 0, k_dim = 0, n_dim = 0;
  const float* bias = nullptr;
  std::vector<float> widened;

  LinearOperands(const LinearOperands&) = delete;
  LinearOperands& operator=(const LinearOperands&) = delete;
  LinearOperands(LinearOperands&&) = default;

  // Backend checked the shapes, dtypes and aliasing (backend.cpp: check_linear); what is left
  // is where the tensors live and the bias as f32.
  LinearOperands(const Tensor& x, const Tensor& w, const Tensor* b, const Tensor& out) {
    cpu::check_on_cpu(w, "linear w");
    cpu::check_on_cpu(x, "linear x");
    cpu::check_on_cpu(out, "linear out");
    n_dim = w.dim(0), k_dim = w.dim(1), r_dim = cpu::rows_of(x);
    if (b && b->defined()) {
      if (b->dtype == DType::F32) {
        cpu::check_on_cpu(*b, "linear bias");
        bias = b->ptr<float>();
      } else {
        widened = cpu::widen_vector(*b, n_dim, "linear bias");
        bias = widened.data();
      }
    }
  }
};

}  // namespace

void CpuBackend::linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  const LinearOperands op(x, w, bias, out);
  float* o = out.ptr<float>();
#if defined(__AVX512BF16__)
  if (x.dtype == DType::BF16) {  // rounded by its producer (bf16 weights: Backend checked)
    return linear_rows<cpu::Bf16Dot>(x.ptr<uint16_t>(), op.r_dim, op.k_dim, w.data, op.bias, o,
                                     op.n_dim, *pool_);
  }
#endif
  const float* xp = x.ptr<float>();
  if (is_block_quantized(w.dtype)) {
    const cpu::QuantizedRows q = cpu::quantize_rows(w.dtype, xp, op.r_dim, op.k_dim, *pool_);
    return cpu::linear_quantized(q, w.ptr<uint8_t>(), op.n_dim, op.bias, o, *pool_);
  }
  switch (w.dtype) {
    case DType::F32:
      return linear_rows<cpu::F32Dot<DType::F32>>(xp, op.r_dim, op.k_dim, w.data, op.bias, o,
                                                  op.n_dim, *pool_);
    case DType::BF16:
#if defined(__AVX512BF16__)
      if (bf16_linear_inputs()) {
        const uint16_t* xb = round_inputs(xp, op.r_dim, op.k_dim, *pool_);
        return linear_rows<cpu::Bf16Dot>(xb, op.r_dim, op.k_dim, w.data, op.bias, o, op.n_dim,
                                         *pool_);
      }
#endif
      return linear_rows<cpu::F32Dot<DType::BF16>>(xp, op.r_dim, op.k_dim, w.data, op.bias, o,
                                                   op.n_dim, *pool_);
    case DType::F16:
      return linear_rows<cpu::F32Dot<DType::F16>>(xp, op.r_dim, op.k_dim, w.data, op.bias, o,
                                                  op.n_dim, *pool_);
    default:  // not in cpu_backend_capabilities().weight_dtypes: Backend refused it
      ATTNRES_CHECK(false, "linear weight dtype " + std::string(dtype_name(w.dtype)));
  }
}

bool CpuBackend::rounds_linear_inputs(std::span<const LinearTarget> targets) const {
  if (!bf16_linear_inputs() || targets.empty()) return false;
  for (const LinearTarget& t : targets) {
    if (t.w->dtype != DType::BF16) return false;
  }
  return true;
}

namespace {
// Whether every target's weights are of one block-quantized format (and so read the same
// quantized x).
bool quantizes_once(std::span<const Backend::LinearTarget> targets) {
  if (targets.empty() || !is_block_quantized(targets[0].w->dtype)) return false;
  for (const Backend::LinearTarget& t : targets) {
    if (t.w->dtype != targets[0].w->dtype) return false;
  }
  return true;
}
}  // namespace

void CpuBackend::linear_many_impl(const Tensor& x, std::span<const LinearTarget> targets) {
#if defined(__AVX512BF16__)
  if (rounds_linear_inputs(targets)) {
    std::vector<LinearOperands> ops;
    ops.reserve(targets.size());
    for (const LinearTarget& t : targets) ops.emplace_back(x, *t.w, t.bias, *t.out);
    const uint16_t* xb = x.dtype == DType::BF16  // rounded by its producer
                             ? x.ptr<uint16_t>()
                             : round_inputs(x.ptr<float>(), ops[0].r_dim, ops[0].k_dim, *pool_);
    for (size_t i = 0; i < targets.size(); ++i) {
      const LinearOperands& op = ops[i];
      linear_rows<cpu::Bf16Dot>(xb, op.r_dim, op.k_dim, targets[i].w->data, op.bias,
                                targets[i].out->ptr<float>(), op.n_dim, *pool_);
    }
    return;
  }
#endif
  if (quantizes_once(targets)) {  // x quantized once for all the targets
    std::vector<LinearOperands> ops;
    ops.reserve(targets.size());
    for (const LinearTarget& t : targets) ops.emplace_back(x, *t.w, t.bias, *t.out);
    const cpu::QuantizedRows q =
        cpu::quantize_rows(targets[0].w->dtype, x.ptr<float>(), ops[0].r_dim, ops[0].k_dim, *pool_);
    for (size_t i = 0; i < targets.size(); ++i)
      cpu::linear_quantized(q, targets[i].w->ptr<uint8_t>(), ops[i].n_dim, ops[i].bias,
                            targets[i].out->ptr<float>(), *pool_);
    return;
  }
  Backend::linear_many_impl(x, targets);
}

void CpuBackend::linear_swiglu_impl(const Tensor& x, const Tensor& w_gate, const Tensor* b_gate,
                                    const Tensor& w_up, const Tensor* b_up, Tensor& gate,
                                    Tensor& up, Tensor& out) {
  const LinearTarget targets[2] = {{&w_gate, b_gate, &gate}, {&w_up, b_up, &up}};
  linear_many_impl(x, targets);
  swiglu_impl(gate, up, out);
}

}  // namespace attnres
