// linear: out[r, o] = sum_k x[r, k] * w[o, k] (+ bias[o]).  x [R, K] f32, w [N, K] stored as
// F32 / BF16 / F16 (row-major, each output's weights contiguous), out [R, N] f32.
//
// Two regimes, two kernels:
// - Decode (R <= 8) is memory-bound: every weight byte is read once per step and the x rows
//   (R * K * 4 bytes) live in L1/L2. The GEMV streams each weight row once for all R input
//   rows: a block of O output rows is converted to f32 in registers and FMA'd against the R
//   x vectors into O * R accumulators (O chosen so that O * R independent FMA chains hide the
//   FMA latency). Threads split the output rows in contiguous static chunks.
// - By default (batch-invariant) larger R runs the GEMV 8 rows at a time, so every row rounds
//   exactly like a decode row and outputs do not depend on batch composition.
// - Opt-in fast prefill (R > 8) treats it as compute-bound: a tile of NR = 2 vectors of outputs by
// KC inputs is
//   widened once into an f32 panel laid out k-major ([KC][NR], "packed"), then reused by every
//   input row through an MR x NR register-blocked outer-product microkernel (broadcast one x,
//   FMA two weight vectors; 12 accumulators with AVX-512). No horizontal reductions, and the
//   conversion cost is amortised over all R rows. Work items are (output tile, row chunk).
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/error.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/cpu_simd.h"

namespace attnres {
namespace {

using cpu::kLanes;
using cpu::VecF;

constexpr int kMaxGemvRows = 8;
constexpr int64_t kPrefetchBytes = 4096;  // GEMV software-prefetch distance (at least)

// Output rows handled per GEMV iteration for R input rows: keeps O * R >= 4 chains in flight.
constexpr int gemv_outputs_per_step(int r) { return r <= 1 ? 4 : r <= 4 ? 2 : 1; }

// out[r, o] for o in [o_begin, o_end), O outputs at a time.
template <DType W, int R, int O>
void gemv_block(const float* x, int64_t k_dim, const cpu::StoredT<W>* w, const float* bias,
                float* out, int64_t n_dim, int64_t o_begin, int64_t o_end) {
  // Software prefetch a fixed distance ahead in the (contiguous) weight stream: with only a
  // few KB per row the hardware prefetcher alone leaves DRAM bandwidth unused.
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
        __builtin_prefetch(wrow[j] + k + ahead, 0, 0);
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

constexpr int kMr = 6;           // input rows per microkernel
constexpr int kNr = 2 * kLanes;  // outputs per microkernel / per packed panel
constexpr int64_t kKc = 256;     // inputs per packed panel (panel = kKc * kNr * 4 bytes)

// c[i][j] = sum_k xr[i][k] * panel[k][j] for i < kMr, j < kNr.
inline void gemm_micro(const float* const* xr, const float* panel, int64_t kc, float* c) {
  VecF acc[kMr][2];
  for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = cpu::vzero();
  for (int64_t k = 0; k < kc; ++k) {
    VecF w0 = cpu::vload(panel + k * kNr), w1 = cpu::vload(panel + k * kNr + kLanes);
    for (int i = 0; i < kMr; ++i) {
      VecF xb = cpu::vset1(xr[i][k]);
      acc[i][0] = cpu::vfma(xb, w0, acc[i][0]);
      acc[i][1] = cpu::vfma(xb, w1, acc[i][1]);
    }
  }
  for (int i = 0; i < kMr; ++i) {
    cpu::vstore(c + i * kNr, acc[i][0]);
    cpu::vstore(c + i * kNr + kLanes, acc[i][1]);
  }
}

// Widens w[o0 .. o0 + kNr, k0 .. k0 + kc] into panel[k][j] (zero for outputs >= n_dim).
template <DType W>
void pack_panel(const cpu::StoredT<W>* w, int64_t k_dim, int64_t n_dim, int64_t o0, int64_t k0,
                int64_t kc, float* panel) {
  for (int j = 0; j < kNr; ++j) {
    if (o0 + j < n_dim) {
      const cpu::StoredT<W>* src = w + (o0 + j) * k_dim + k0;
      for (int64_t k = 0; k < kc; ++k) panel[k * kNr + j] = cpu::load_scalar<W>(src + k);
    } else {
      for (int64_t k = 0; k < kc; ++k) panel[k * kNr + j] = 0.0f;
    }
  }
}

template <DType W>
void gemm(const float* x, int64_t r_dim, int64_t k_dim, const cpu::StoredT<W>* w, const float* bias,
          float* out, int64_t n_dim, cpu::WorkerPool& pool) {
  const int threads = pool.size();
  const int64_t tiles = (n_dim + kNr - 1) / kNr;
  const int64_t row_blocks = (r_dim + kMr - 1) / kMr;
  // Enough work items for every thread; as few row chunks as possible (each packs its panel).
  int64_t chunks = std::max<int64_t>(1, (4 * threads + tiles - 1) / tiles);
  chunks = std::min(chunks, row_blocks);
  const int64_t blocks_per_chunk = (row_blocks + chunks - 1) / chunks;
  const int64_t items = tiles * chunks;
  pool.run(threads > 1 && items > 1 ? threads : 1, [&](int tid, int team) {
    std::vector<float> panel(static_cast<size_t>(kKc * kNr));
    alignas(64) float c[kMr * kNr];
    for (int64_t item : cpu::static_block(items, tid, team)) {
      const int64_t tile = item % tiles, chunk = item / tiles;
      const int64_t o0 = tile * kNr, n_valid = std::min<int64_t>(kNr, n_dim - o0);
      const int64_t r_begin = chunk * blocks_per_chunk * kMr;
      const int64_t r_end = std::min(r_dim, r_begin + blocks_per_chunk * kMr);
      for (int64_t k0 = 0; k0 < k_dim; k0 += kKc) {
        const int64_t kc = std::min(kKc, k_dim - k0);
        const bool first = k0 == 0, last = k0 + kc == k_dim;
        pack_panel<W>(w, k_dim, n_dim, o0, k0, kc, panel.data());
        for (int64_t r0 = r_begin; r0 < r_end; r0 += kMr) {
          const float* xr[kMr];
          for (int i = 0; i < kMr; ++i) xr[i] = x + std::min(r0 + i, r_end - 1) * k_dim + k0;
          gemm_micro(xr, panel.data(), kc, c);
          const int64_t m_valid = std::min<int64_t>(kMr, r_end - r0);
          for (int64_t i = 0; i < m_valid; ++i) {
            float* dst = out + (r0 + i) * n_dim + o0;
            const float* src = c + i * kNr;
            for (int64_t j = 0; j < n_valid; ++j) {
              float v = first ? src[j] : dst[j] + src[j];
              if (last && bias) v += bias[o0 + j];
              dst[j] = v;
            }
          }
        }
      }
    }
  });
}

template <DType W>
void linear_typed(const float* x, int64_t r_dim, int64_t k_dim, const void* w_data,
                  const float* bias, float* out, int64_t n_dim, cpu::WorkerPool& pool,
                  bool batch_invariant) {
  const auto* w = static_cast<const cpu::StoredT<W>*>(w_data);
  if (k_dim == 0) {  // empty dot products: out = bias (or 0)
    for (int64_t r = 0; r < r_dim; ++r)
      for (int64_t o = 0; o < n_dim; ++o) out[r * n_dim + o] = bias ? bias[o] : 0.0f;
    return;
  }
  if (r_dim > kMaxGemvRows) {
    if (!batch_invariant) return gemm<W>(x, r_dim, k_dim, w, bias, out, n_dim, pool);
    // The GEMV's arithmetic for a row does not depend on how many rows share the call, so 8
    // rows at a time give every row the same rounding as a single decode row.
    for (int64_t r0 = 0; r0 < r_dim; r0 += kMaxGemvRows) {
      linear_typed<W>(x + r0 * k_dim, std::min<int64_t>(kMaxGemvRows, r_dim - r0), k_dim, w_data,
                      bias, out + r0 * n_dim, n_dim, pool, batch_invariant);
    }
    return;
  }
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
      return linear_typed<DType::F32>(xp, r_dim, k_dim, w.data, b, op, n_dim, *pool_,
                                      batch_invariant_);
    case DType::BF16:
      return linear_typed<DType::BF16>(xp, r_dim, k_dim, w.data, b, op, n_dim, *pool_,
                                       batch_invariant_);
    case DType::F16:
      return linear_typed<DType::F16>(xp, r_dim, k_dim, w.data, b, op, n_dim, *pool_,
                                      batch_invariant_);
    default:
      ATTNRES_CHECK(false, "linear weight dtype " + std::string(dtype_name(w.dtype)));
  }
}

}  // namespace attnres
