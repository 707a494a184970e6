// linear: out[r, o] = sum_k x[r, k] * w[o, k] (+ bias[o]).  x [R, K] f32, w [N, K] stored as
// F32 / BF16 / F16 (row-major, each output's weights contiguous), out [R, N] f32.
//
// Two regimes, two kernels, one arithmetic:
// - Decode (R <= 8) is memory-bound: every weight byte is read once per step and the x rows
//   (R * K * 4 bytes) live in L1/L2. The GEMV streams each weight row once for all R input
//   rows: a block of O output rows is converted to f32 in registers and FMA'd against the R
//   x vectors into O * R accumulators (O chosen so that O * R independent FMA chains hide the
//   FMA latency). Threads split the output rows in contiguous static chunks.
// - Prefill (R > 8) is compute-bound: the packed GEMM below widens each tile of outputs once
//   and reuses it across a chunk of rows from registers and L1.
// Both compute every output element the same way (kLanes lane-wise FMA chains over k in
// order, one fixed hsum tree, the scalar tail, the bias), so a row's result never depends on
// how many rows share the call: prefill rounds exactly like decoding token by token, and a
// request's logits do not depend on its batch-mates (batch invariance, issue #19).
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_simd.h"
#include "kernels/cpu/thread_scratch.h"

namespace attnres {
namespace {

using cpu::kLanes;
using cpu::VecF;

constexpr int kMaxGemvRows = 8;
constexpr int64_t kPrefetchBytes = 32768;  // GEMV software-prefetch distance (at least)

// Output rows handled per GEMV iteration for R input rows: keeps O * R >= 8 FMA chains in
// flight (two FMA units, four cycles each) and, for one row, 8 weight streams.
constexpr int gemv_outputs_per_step(int r) { return r <= 1 ? 8 : r <= 4 ? 2 : 1; }

// out[r, o] for o in [o_begin, o_end), O outputs at a time.
template <DType W, int R, int O>
void gemv_block(const float* x, int64_t k_dim, const cpu::StoredT<W>* w, const float* bias,
                float* out, int64_t n_dim, int64_t o_begin, int64_t o_end) {
  // Software prefetch into L2 (prefetcht1) a fixed distance ahead in the contiguous weight
  // stream: a core alone cannot keep enough misses in flight to use DRAM's bandwidth. Measured
  // on the 2-core Xeon (docs/BENCHMARKS.md, issue #19): 32 KB ahead into L2 streams 26-27 GB/s
  // from DRAM against 17-22 without, while 4 KB ahead with prefetchnta (into L1, the earlier
  // choice, tuned on an EPYC) was slower than none, its line-fill buffers being the limit.
  const int64_t block_elems = O * k_dim;
  const int64_t ahead =
      block_elems * std::max<int64_t>(1, kPrefetchBytes / (block_elems * sizeof(cpu::StoredT<W>)));
  int64_t o = o_begin;
  for (; o + O <= o_end; o += O) {
    VecF acc[O][R];
    for (int j = 0; j < O; ++j)
      for (int r = 0; r < R; ++r) acc[j][r] = cpu::vzero();
    const cpu::StoredT<W>* wrow[O];
    for (int j = 0; j < O; ++j) wrow[j] = w + (o + j) * k_dim;
    int64_t k = 0;
    for (; k + kLanes <= k_dim; k += kLanes) {
      VecF xv[R];
      for (int r = 0; r < R; ++r) xv[r] = cpu::vload(x + r * k_dim + k);
      for (int j = 0; j < O; ++j) {
        __builtin_prefetch(wrow[j] + k + ahead, 0, 2);
        VecF wv = cpu::vload_w<W>(wrow[j] + k);
        for (int r = 0; r < R; ++r) acc[j][r] = cpu::vfma(wv, xv[r], acc[j][r]);
      }
    }
    for (int j = 0; j < O; ++j) {
      for (int r = 0; r < R; ++r) {
        float s = cpu::hsum(acc[j][r]);
        // std::fma, not `s += a * b`: whether the compiler contracts that may differ between
        // instantiations, and every R must round identically (batch invariance).
        for (int64_t kk = k; kk < k_dim; ++kk)
          s = std::fma(cpu::load_scalar<W>(wrow[j] + kk), x[r * k_dim + kk], s);
        if (bias) s += bias[o + j];
        out[r * n_dim + o + j] = s;
      }
    }
  }
  if constexpr (O > 1) {
    if (o < o_end) gemv_block<W, R, 1>(x, k_dim, w, bias, out, n_dim, o, o_end);
  }
}

template <DType W, int R>
void gemv(const float* x, int64_t k_dim, const cpu::StoredT<W>* w, const float* bias, float* out,
          int64_t n_dim, cpu::WorkerPool& pool) {
  constexpr int64_t kChunk = 32;  // output rows per scheduling unit (a multiple of every O)
  const int64_t chunks = (n_dim + kChunk - 1) / kChunk;
  const bool parallel = pool.size() > 1 && n_dim * k_dim >= (1 << 15);
  pool.parallel_for(chunks, parallel, [&](int64_t c) {
    int64_t begin = c * kChunk, end = std::min(n_dim, begin + kChunk);
    gemv_block<W, R, gemv_outputs_per_step(R)>(x, k_dim, w, bias, out, n_dim, begin, end);
  });
}

// Prefill (R > 8): the GEMV's arithmetic, blocked for reuse. Each output element is computed
// exactly as gemv_block computes it (kLanes lane-wise FMA chains over k in order, hsum, the
// scalar tail, then the bias), so a row's result is bit for bit the same as when it is decoded
// alone: batch-invariant by construction, whatever R, the tiling or the thread count. The
// speed comes from reuse, not from reordering the sums: a tile of kNr outputs is widened once
// into an f32 panel ([k step][output][lane]) and shared by every row of a row chunk; a
// microkernel keeps kMr x kNr accumulators in registers, loading kMr x vectors and kNr panel
// vectors per k step (AVX-512: 24 FMAs for 10 loads). Row chunks keep x in L2.
constexpr int kMr = kLanes >= 16 ? 4 : 3;  // input rows per microkernel
constexpr int kNr = kLanes >= 16 ? 6 : 4;  // outputs per microkernel and per packed panel
constexpr int64_t kChunkBytes = 1 << 20;  // x bytes per row chunk (stays in L2)
constexpr int64_t kBlockSteps = 512 / kLanes;  // k steps per block (the panel's block in L1)

// One microkernel call: k steps [s0, s1) for input rows xr[0 .. kMr) and the kNr outputs of
// `panel`, with kMr x kNr lane-wise accumulators in registers. They start from zero when s0
// is 0, else from `partial` (where the previous k block left them); after the last k block
// they are finished with the same steps, in the same order, as the end of gemv_block (hsum,
// the scalar tail, the bias) into out rows 0 .. m_valid, outputs o0 .. o0 + n_valid;
// otherwise they are saved to `partial`. Splitting k into blocks this way changes nothing:
// every lane still accumulates its k in order.
template <DType W>
void gemm_micro(const float* const* xr, const float* panel, int64_t s0, int64_t s1,
                int64_t ksteps, float* partial, int64_t k_dim, const cpu::StoredT<W>* w,
                const float* bias, int64_t o0, int64_t m_valid, int64_t n_valid, float* out,
                int64_t n_dim) {
  VecF acc[kMr][kNr];
  for (int i = 0; i < kMr; ++i)
    for (int j = 0; j < kNr; ++j)
      acc[i][j] = s0 == 0 ? cpu::vzero() : cpu::vload(partial + (i * kNr + j) * kLanes);
  const float* xp[kMr];
  for (int i = 0; i < kMr; ++i) xp[i] = xr[i];
  for (int64_t s = s0; s < s1; ++s) {
    VecF xv[kMr];
    for (int i = 0; i < kMr; ++i) xv[i] = cpu::vload(xp[i] + s * kLanes);
    const float* p = panel + s * kNr * kLanes;
    for (int j = 0; j < kNr; ++j) {
      VecF wv = cpu::vload(p + j * kLanes);
      for (int i = 0; i < kMr; ++i) acc[i][j] = cpu::vfma(wv, xv[i], acc[i][j]);
    }
  }
  if (s1 < ksteps) {
    for (int i = 0; i < kMr; ++i)
      for (int j = 0; j < kNr; ++j) cpu::vstore(partial + (i * kNr + j) * kLanes, acc[i][j]);
    return;
  }
  float sums[kMr * kNr];
  cpu::hsum_many(&acc[0][0], kMr * kNr, sums);
  const int64_t k_tail = ksteps * kLanes;
  for (int64_t i = 0; i < m_valid; ++i) {
    for (int64_t j = 0; j < n_valid; ++j) {
      float s = sums[i * kNr + j];
      const cpu::StoredT<W>* wrow = w + (o0 + j) * k_dim;
      for (int64_t kk = k_tail; kk < k_dim; ++kk)
        s = std::fma(cpu::load_scalar<W>(wrow + kk), xr[i][kk], s);
      if (bias) s += bias[o0 + j];
      out[i * n_dim + o0 + j] = s;
    }
  }
}

// Widens the whole vectors of w[o0 .. o0 + kNr, 0 .. ksteps * kLanes) into
// panel[s][j][lane] (zero for outputs >= n_dim). Exact: bf16 and f16 widen to f32 exactly.
template <DType W>
void pack_panel(const cpu::StoredT<W>* w, int64_t k_dim, int64_t n_dim, int64_t o0,
                int64_t ksteps, float* panel) {
  for (int j = 0; j < kNr; ++j) {
    const bool valid = o0 + j < n_dim;
    const cpu::StoredT<W>* src = w + (o0 + j) * k_dim;
    for (int64_t s = 0; s < ksteps; ++s) {
      float* dst = panel + (s * kNr + j) * kLanes;
      cpu::vstore(dst, valid ? cpu::vload_w<W>(src + s * kLanes) : cpu::vzero());
    }
  }
}

// Microkernel calls per tile and row chunk: the k blocks times the chunk's row blocks.
int64_t micro_calls_per_tile(int64_t ksteps, int64_t chunk_rows) {
  return (std::max<int64_t>(ksteps, 1) + kBlockSteps - 1) / kBlockSteps *
         ((chunk_rows + kMr - 1) / kMr);
}

// The next tile's weight rows, prefetched into L2 a few cache lines per microkernel call of
// this tile, so that pack_panel finds them there. Without it pack_panel reads every tile's
// rows from DRAM with nothing overlapping the wait (a 0.6B forward streams 1.2 GB of weights
// past the caches); with it prefill was 4-10% faster (medians over three alternated rounds,
// docs/BENCHMARKS.md). Only a hint: no value changes.
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

template <DType W>
void gemm(const float* x, int64_t r_dim, int64_t k_dim, const cpu::StoredT<W>* w, const float* bias,
          float* out, int64_t n_dim, cpu::WorkerPool& pool) {
  const int64_t ksteps = k_dim / kLanes;
  const int64_t tiles = (n_dim + kNr - 1) / kNr;
  const int64_t chunk_rows = std::max<int64_t>(
      kMr, kChunkBytes / (k_dim * static_cast<int64_t>(sizeof(float))) / kMr * kMr);
  const bool parallel = pool.size() > 1 && tiles > 1;
  // Threads split the output tiles (each widens only its own panels); every thread walks the
  // row chunks in the same order, so the chunk a thread works on is in its own L2.
  pool.run(parallel ? pool.size() : 1, [&](int tid, int team) {
    // Per-thread and cache-line aligned (thread_scratch.h: a heap block's placement cost up
    // to 12%).
    float* panel = cpu::thread_scratch(cpu::ScratchSlot::GemmPanel,
                                       static_cast<size_t>(std::max<int64_t>(1, ksteps * kNr * kLanes)));
    float* partials = cpu::thread_scratch(
        cpu::ScratchSlot::GemmPartials, static_cast<size_t>((chunk_rows / kMr) * kMr * kNr * kLanes));
    const cpu::IndexRange my_tiles = cpu::static_block(tiles, tid, team);
    for (int64_t r_begin = 0; r_begin < r_dim; r_begin += chunk_rows) {
      const int64_t r_end = std::min(r_dim, r_begin + chunk_rows);
      for (int64_t tile : my_tiles) {
        const int64_t o0 = tile * kNr, n_valid = std::min<int64_t>(kNr, n_dim - o0);
        pack_panel<W>(w, k_dim, n_dim, o0, ksteps, panel);
        // The thread's next tile: the following one, or its first again for the next chunk.
        const int64_t next_tile = tile + 1 < my_tiles.end_ ? tile + 1
                                  : r_end < r_dim         ? my_tiles.begin_
                                                          : -1;
        const int64_t next_o0 = next_tile < 0 ? n_dim : next_tile * kNr;
        NextPanelPrefetch next(w, k_dim, next_o0, std::min(n_dim, next_o0 + kNr),
                               micro_calls_per_tile(ksteps, r_end - r_begin));
        // k blocks outermost, so the panel's block stays in L1 while every row block of the
        // chunk uses it.
        for (int64_t s0 = 0; s0 < std::max<int64_t>(ksteps, 1); s0 += kBlockSteps) {
          const int64_t s1 = std::min(ksteps, s0 + kBlockSteps);
          for (int64_t r0 = r_begin; r0 < r_end; r0 += kMr) {
            const float* xr[kMr];  // rows past the end repeat the last one (computed, not stored)
            for (int i = 0; i < kMr; ++i) xr[i] = x + std::min(r0 + i, r_end - 1) * k_dim;
            float* partial = partials + (r0 - r_begin) * kNr * kLanes;
            next.step();
            gemm_micro<W>(xr, panel, s0, s1, ksteps, partial, k_dim, w, bias, o0,
                          std::min<int64_t>(kMr, r_end - r0), n_valid, out + r0 * n_dim, n_dim);
          }
        }
      }
    }
  });
}

template <DType W>
void linear_typed(const float* x, int64_t r_dim, int64_t k_dim, const void* w_data,
                  const float* bias, float* out, int64_t n_dim, cpu::WorkerPool& pool) {
  const auto* w = static_cast<const cpu::StoredT<W>*>(w_data);
  if (k_dim == 0) {  // empty dot products: out = bias (or 0)
    for (int64_t r = 0; r < r_dim; ++r)
      for (int64_t o = 0; o < n_dim; ++o) out[r * n_dim + o] = bias ? bias[o] : 0.0f;
    return;
  }
  if (r_dim > kMaxGemvRows) return gemm<W>(x, r_dim, k_dim, w, bias, out, n_dim, pool);
  switch (r_dim) {
    case 1:
      return gemv<W, 1>(x, k_dim, w, bias, out, n_dim, pool);
    case 2:
      return gemv<W, 2>(x, k_dim, w, bias, out, n_dim, pool);
    case 3:
      return gemv<W, 3>(x, k_dim, w, bias, out, n_dim, pool);
    case 4:
      return gemv<W, 4>(x, k_dim, w, bias, out, n_dim, pool);
    case 5:
      return gemv<W, 5>(x, k_dim, w, bias, out, n_dim, pool);
    case 6:
      return gemv<W, 6>(x, k_dim, w, bias, out, n_dim, pool);
    case 7:
      return gemv<W, 7>(x, k_dim, w, bias, out, n_dim, pool);
    case 8:
      return gemv<W, 8>(x, k_dim, w, bias, out, n_dim, pool);
    default:
      return;  // r_dim == 0: nothing to do
  }
}

}  // namespace

void CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  ATTNRES_CHECK(w.rank() == 2 && w.device == Device::CPU, "linear weight " + shape_str(w.shape));
  const int64_t n_dim = w.dim(0), k_dim = w.dim(1);
  cpu::check_f32_rows(x, k_dim, "linear x");
  cpu::check_f32_rows(out, n_dim, "linear out");
  const int64_t r_dim = cpu::rows_of(x);
  ATTNRES_CHECK(cpu::rows_of(out) == r_dim,
                "linear rows: x " + shape_str(x.shape) + " out " + shape_str(out.shape));
  ATTNRES_CHECK(x.data != out.data || r_dim == 0, "linear x and out must not alias");
  std::vector<float> bias_widened;
  const float* b = nullptr;
  if (bias && bias->defined()) {
    if (bias->dtype == DType::F32) {
      ATTNRES_CHECK(bias->numel() == n_dim, "linear bias " + shape_str(bias->shape));
      b = bias->ptr<float>();
    } else {
      bias_widened = cpu::widen_vector(*bias, n_dim, "linear bias");
      b = bias_widened.data();
    }
  }
  const float* xp = x.ptr<float>();
  float* op = out.ptr<float>();
  switch (w.dtype) {
    case DType::F32:
      return linear_typed<DType::F32>(xp, r_dim, k_dim, w.data, b, op, n_dim, *pool_);
    case DType::BF16:
      return linear_typed<DType::BF16>(xp, r_dim, k_dim, w.data, b, op, n_dim, *pool_);
    case DType::F16:
      return linear_typed<DType::F16>(xp, r_dim, k_dim, w.data, b, op, n_dim, *pool_);
    default:
      ATTNRES_CHECK(false, "linear weight dtype " + std::string(dtype_name(w.dtype)));
  }
}

}  // namespace attnres
