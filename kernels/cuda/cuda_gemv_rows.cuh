// The GEMV's inner pieces, shared by cuda_gemv.cu (x read from global memory),
// cuda_gemv_prenorm.cu (x computed by the block into shared memory first) and cuda_gemv_rope.cu
// (RoPE + KV store as the epilogue): the weight row's dot products with the R rows of x, and
// the walk from a warp's output row to its segment.
// The same code in both, so a row's sum has the same order and the same bits either way; the
// GEMV levers (cuda_gemv_levers.h, kLevers) keep that order too.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/cuda_bf16_round.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_gemv_bulk.cuh"
#include "kernels/cuda/cuda_gemv_levers.h"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {

constexpr int kGemvWarps = 8;  // one warp per output row, 8 per block
static_assert(kGemvWarps == kGemvBulkWarps, "the bulk lever's layout has a slot per warp");

// Calls f(std::integral_constant<int, R>{}) with R = rows, 1..8 (the GEMVs' row count is a
// template parameter: their accumulators are registers indexed by constants).
template <class F>
void dispatch_gemv_rows(int64_t rows, F&& f) {
  dispatch_1_to_8(rows, std::forward<F>(f));
}

// Widens the kVec weights packed in a 16-byte vector: from global memory through the read-only
// path, or (kShared, the bulk lever) from shared memory.
template <class W>
struct WeightVector {
  static constexpr int kVec = 16 / sizeof(W);
  float v[kVec];
  template <bool kShared = false>
  __device__ __forceinline__ void load(const W* p) {
    uint4 raw;
    if constexpr (kShared) {
      raw = *reinterpret_cast<const uint4*>(p);
    } else {
      raw = __ldg(reinterpret_cast<const uint4*>(p));
    }
    const W* e = reinterpret_cast<const W*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = to_f32(e[i]);
  }
};

// acc[r] += (lane's share of) x[r] . wr, r < R: the warp's lanes split the row as
// cuda_gemv.cu's header says (16-byte vectors, 512 contiguous bytes per warp and step).
// kSharedWeights: wr is the row's copy in shared memory (the bulk lever; vector path only).
template <class W, int R, bool kVectorized, bool kSharedWeights = false>
__device__ __forceinline__ void row_dot(const float* __restrict__ x, const W* __restrict__ wr,
                                        int64_t K, int lane, float (&acc)[R]) {
  static_assert(kVectorized || !kSharedWeights, "shared weight rows are read as vectors");
  if constexpr (kVectorized) {
    constexpr int kVec = WeightVector<W>::kVec;
    // From shared memory a load's latency is short, and 4 iterations' x values of 7 or 8 rows
    // held at once spilled the bulk SwiGLU kernels (f16 / bf16) at 255 registers.
    constexpr int kUnroll = kSharedWeights ? 2 : 4;
#pragma unroll kUnroll
    for (int64_t k = static_cast<int64_t>(lane) * kVec; k < K; k += 32 * kVec) {
      WeightVector<W> wv;
      wv.template load<kSharedWeights>(wr + k);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4* xr = reinterpret_cast<const float4*>(x + r * K + k);
#pragma unroll
        for (int q = 0; q < kVec / 4; ++q) {
          const float4 xv = xr[q];
          acc[r] += wv.v[4 * q] * xv.x + wv.v[4 * q + 1] * xv.y + wv.v[4 * q + 2] * xv.z +
                    wv.v[4 * q + 3] * xv.w;
        }
      }
    }
  } else {
    for (int64_t k = lane; k < K; k += 32) {
      const float wk = to_f32(wr[k]);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += wk * x[r * K + k];
    }
  }
}

// The GEMV levers (cuda_gemv_levers.h) as a kernel template parameter: a bit mask. The
// kernels with a lever are kernels of their own (the `*_lever_kernel`s), declared with
// gemv_lever_min_blocks: the deep lever's loads want registers, and left to itself ptxas caps
// some instances at 80 and spills (f32 weights, 6 and 7 rows); two blocks per SM allow 128
// with no spill. The bulk lever: one block per SM as the minimum (up to 255 registers; with
// none, ptxas capped gemv_swiglu_lever_kernel<f16, 6, bulk> at 64 and spilled). Otherwise no
// minimum (0: the kernels without a lever's declaration), since row_dot's unrolled loop
// spilled under the 128 cap (f16 / bf16 at 5 to 8 rows). The kernels without a lever keep
// their declaration and code.
constexpr int kGemvLeverDeep = 1;      // row_dot_deep in place of row_dot
constexpr int kGemvLeverPrefetch = 2;  // the warp's weight rows to L2 before the PDL wait
constexpr int kGemvLeverBulk = 4;      // the warp's rows into shared memory (cuda_gemv_bulk.cuh)
constexpr int kGemvLeverMinBlocks = 2;
constexpr int gemv_lever_min_blocks(int levers) {
  return (levers & kGemvLeverDeep) != 0   ? kGemvLeverMinBlocks
         : (levers & kGemvLeverBulk) != 0 ? 1
                                          : 0;
}

// The mask of the levers the current backend has on (0: the kernels without a lever).
inline int gemv_levers_now() {
  return (gemv_deep_now() ? kGemvLeverDeep : 0) |
         (gemv_weight_prefetch_now() ? kGemvLeverPrefetch : 0) |
         (gemv_bulk_now() ? kGemvLeverBulk : 0);
}

// The levers a launch runs with, out of `levers` (gemv_levers_now): the bulk lever alone where
// the launch's shared memory with it, `bulk_shared_bytes`, is within kMaxGemvBulkSharedBytes
// (its copies are issued before the PDL wait, as the prefetch lever's are, and replace the
// loads the deep lever deepens), else the others. A kernel without a bulk instance passes
// SIZE_MAX.
inline int gemv_launch_levers(int levers, size_t bulk_shared_bytes) {
  if ((levers & kGemvLeverBulk) != 0 && bulk_shared_bytes <= kMaxGemvBulkSharedBytes)
    return kGemvLeverBulk;
  return levers & ~kGemvLeverBulk;
}

// Calls f(std::integral_constant<int, L>{}) with L = levers, a mask other than 0 that
// gemv_launch_levers gave. kBulk: the kernel has a bulk instance (else that case is not
// compiled, and a bulk mask fails the check).
template <bool kBulk, class F>
void dispatch_gemv_levers(int levers, F&& f) {
  switch (levers) {
    case kGemvLeverDeep:
      return f(std::integral_constant<int, kGemvLeverDeep>{});
    case kGemvLeverPrefetch:
      return f(std::integral_constant<int, kGemvLeverPrefetch>{});
    case kGemvLeverDeep | kGemvLeverPrefetch:
      return f(std::integral_constant<int, kGemvLeverDeep | kGemvLeverPrefetch>{});
    case kGemvLeverBulk:
      if constexpr (kBulk) return f(std::integral_constant<int, kGemvLeverBulk>{});
      [[fallthrough]];
    default:
      ATTNRES_CHECK(false, "gemv levers " + std::to_string(levers));
  }
}

// Asks L2 for the bytes [p, p + bytes): lane i prefetches the 128-byte lines i, i + 32, ...
// A hint with no effect on any value (prefetch.L2, generic address), so a warp may issue it
// before griddepcontrol.wait for memory the kernel ahead does not write.
__device__ __forceinline__ void prefetch_to_l2(const void* p, int64_t bytes, int lane) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(p) & ~uintptr_t{127};
  const uintptr_t end = reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(bytes);
#pragma unroll 1
  for (uintptr_t a = begin + static_cast<uintptr_t>(lane) * 128; a < end; a += 32 * 128)
    asm volatile("prefetch.L2 [%0];" ::"l"(a));
}

// The 16-byte weight loads a lane issues under the deep lever before it consumes the first.
constexpr int kGemvDeepLoads = 8;

// acc[r] += (one vector's share of) x[r] . w, the vector raw holding w[k .. k + kVec): the
// operations and order of row_dot's vector loop body.
template <class W, int R>
__device__ __forceinline__ void fma_weight_vector(const uint4& raw, const float* __restrict__ x,
                                                  int64_t K, int64_t k, float (&acc)[R]) {
  constexpr int kVec = WeightVector<W>::kVec;
  const W* e = reinterpret_cast<const W*>(&raw);
  float v[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = to_f32(e[i]);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float4* xr = reinterpret_cast<const float4*>(x + r * K + k);
#pragma unroll
    for (int q = 0; q < kVec / 4; ++q) {
      const float4 xv = xr[q];
      acc[r] += v[4 * q] * xv.x + v[4 * q + 1] * xv.y + v[4 * q + 2] * xv.z + v[4 * q + 3] * xv.w;
    }
  }
}

// fma_weight_vector for two rows' vectors raw0 and raw1 at the same k, each x float4 loaded once
// for both: acc0 and acc1 each get fma_weight_vector's expression. Reading x once per k, not
// once per row, keeps the x values of a whole batch of loads from staying live (with them, the
// 7- and 8-row bf16 and 2- and 3-row f32 instances of gemv_rope_lever_kernel spilled).
template <class W, int R>
__device__ __forceinline__ void fma_weight_vectors(const uint4& raw0, const uint4& raw1,
                                                   const float* __restrict__ x, int64_t K,
                                                   int64_t k, float (&acc0)[R], float (&acc1)[R]) {
  constexpr int kVec = WeightVector<W>::kVec;
  const W* e0 = reinterpret_cast<const W*>(&raw0);
  const W* e1 = reinterpret_cast<const W*>(&raw1);
  float v0[kVec], v1[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    v0[i] = to_f32(e0[i]);
    v1[i] = to_f32(e1[i]);
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float4* xr = reinterpret_cast<const float4*>(x + r * K + k);
#pragma unroll
    for (int q = 0; q < kVec / 4; ++q) {
      const float4 xv = xr[q];
      acc0[r] +=
          v0[4 * q] * xv.x + v0[4 * q + 1] * xv.y + v0[4 * q + 2] * xv.z + v0[4 * q + 3] * xv.w;
      acc1[r] +=
          v1[4 * q] * xv.x + v1[4 * q + 1] * xv.y + v1[4 * q + 2] * xv.z + v1[4 * q + 3] * xv.w;
    }
  }
}

// row_dot's vector path for kRows (1 or 2) weight rows w0 (and w1) at once, the deep lever: a
// lane loads the next kLoads / kRows vectors of every row (the same lane-strided positions
// row_dot reads; kLoads is kGemvDeepLoads unless a kernel's registers call for fewer), then
// consumes them. Each acc sees the same products in the same
// order as row_dot gives it, so the sums have the same bits; only the loads move earlier.
template <class W, int R, int kRows, int kLoads = kGemvDeepLoads>
__device__ __forceinline__ void row_dot_deep(const float* __restrict__ x, const W* __restrict__ w0,
                                             const W* __restrict__ w1, int64_t K, int lane,
                                             float (&acc0)[R], float (&acc1)[R]) {
  static_assert(kRows == 1 || kRows == 2, "row_dot_deep reads one or two rows");
  constexpr int kVec = WeightVector<W>::kVec;
  constexpr int kDepth = kLoads / kRows;
  constexpr int64_t kStep = 32 * kVec;
#pragma unroll 1
  for (int64_t k0 = static_cast<int64_t>(lane) * kVec; k0 < K; k0 += kDepth * kStep) {
    uint4 raw0[kDepth], raw1[kDepth];
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int64_t k = k0 + d * kStep;
      const bool in = k < K;
      raw0[d] = in ? __ldg(reinterpret_cast<const uint4*>(w0 + k)) : make_uint4(0, 0, 0, 0);
      if constexpr (kRows == 2)
        raw1[d] = in ? __ldg(reinterpret_cast<const uint4*>(w1 + k)) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int d = 0; d < kDepth; ++d) {
      const int64_t k = k0 + d * kStep;
      if (k >= K) continue;
      if constexpr (kRows == 2) {
        fma_weight_vectors<W, R>(raw0[d], raw1[d], x, K, k, acc0, acc1);
      } else {
        fma_weight_vector<W, R>(raw0[d], x, K, k, acc0);
      }
    }
  }
}

// One output row of the GEMV for the R rows of x: y[r] = x[r] . wr + bias, in every lane of
// the warp: row_dot, then warp_sum, then the bias, the operations and order of gemv_warp below
// (which keeps its own copy of these lines: written through this helper, ptxas spilled
// gemv_prenorm_kernel<f32, 2>).
template <class W, int R, bool kVectorized>
__device__ __forceinline__ void gemv_row(const float* __restrict__ x, const W* __restrict__ wr,
                                         int64_t K, int lane, float bias, float (&y)[R]) {
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  row_dot<W, R, kVectorized>(x, wr, K, lane, acc);
#pragma unroll
  for (int r = 0; r < R; ++r) y[r] = warp_sum(acc[r]) + bias;
}

// Which segment output row o (counted over every segment in turn) falls in: seg and o become
// that segment and the row inside it; false past the last. Constant indices only: a run-time
// index into the parameter struct copies it to local memory (a 128-byte stack frame).
__device__ __forceinline__ bool find_segment(const GemvSegments& segments, int64_t& o,
                                             GemvSegment& seg) {
  bool found = false;
#pragma unroll
  for (int i = 0; i < kMaxGemvSegments; ++i) {
    if (found || i >= segments.count) continue;
    if (o < segments.seg[i].n) {
      seg = segments.seg[i];
      found = true;
    } else {
      o -= segments.seg[i].n;
    }
  }
  return found;
}

// The prefetch lever's share of a warp of gemv_warp: its weight row (the one gemv_warp reads)
// to L2. Reads only the kernel's parameters, so it may run before wait_for_previous_kernel.
template <class W>
__device__ __forceinline__ void prefetch_gemv_warp_row(int64_t K, const GemvSegments& segments) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t o = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  GemvSegment seg;
  if (!find_segment(segments, o, seg)) return;
  prefetch_to_l2(static_cast<const W*>(seg.w) + o * K, K * static_cast<int64_t>(sizeof(W)), lane);
}

// The same for a warp of gemv_swiglu_warp: its gate and up rows.
template <class W>
__device__ __forceinline__ void prefetch_swiglu_warp_rows(int64_t K, const GemvSegment& gate,
                                                          const GemvSegment& up) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  if (o >= gate.n) return;
  const int64_t bytes = K * static_cast<int64_t>(sizeof(W));
  prefetch_to_l2(static_cast<const W*>(gate.w) + o * K, bytes, lane);
  prefetch_to_l2(static_cast<const W*>(up.w) + o * K, bytes, lane);
}

// The bulk lever's share of a warp of gemv_warp: its weight row into shared memory from byte
// `offset` on (cuda_gemv_bulk.cuh). Reads only the kernel's parameters, so it may run before
// wait_for_previous_kernel.
template <class W>
__device__ __forceinline__ void bulk_gemv_warp_row(int64_t K, const GemvSegments& segments,
                                                   size_t offset) {
  const int warp = threadIdx.x >> 5;
  int64_t o = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  GemvSegment seg;
  if (!find_segment(segments, o, seg)) return;
  gemv_bulk_issue<W>(offset, K, static_cast<const W*>(seg.w) + o * K, nullptr);
}

// The same for a warp of gemv_swiglu_warp: its gate row, then its up row.
template <class W>
__device__ __forceinline__ void bulk_swiglu_warp_rows(int64_t K, const GemvSegment& gate,
                                                      const GemvSegment& up, size_t offset) {
  const int warp = threadIdx.x >> 5;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  if (o >= gate.n) return;
  gemv_bulk_issue<W>(offset, K, static_cast<const W*>(gate.w) + o * K,
                     static_cast<const W*>(up.w) + o * K);
}

// A warp's whole share of gemv_kernel, x [R, K] in global or shared memory: output row
// (blockIdx.x * kGemvWarps + warp) of the segments, bias then residual (the rounding of linear
// then add_inplace; the same lane reads residual[i] before it writes out[i], so out may be the
// residual; kResidual false: segments without one, the code left out). kPush (the bank-push
// lever, cuda_gemv_push.cu): lane 0 also stores the output's bf16 rounding into entry, laid
// out as the segment's out (one segment); without it entry is never read. Returns early for a
// warp past the last row: no block barriers may follow.
// kLevers with the bulk lever: the weight row is the warp's copy in shared memory from byte
// bulk_offset on, which bulk_gemv_warp_row requested.
template <class W, int R, bool kVectorized, bool kResidual = true, int kLevers = 0,
          bool kPush = false>
__device__ __forceinline__ void gemv_warp(const float* __restrict__ x, int64_t K,
                                          const GemvSegments& segments, size_t bulk_offset = 0,
                                          uint16_t* entry = nullptr) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int64_t o = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  GemvSegment seg;
  if (!find_segment(segments, o, seg)) return;  // whole warp
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  const W* wr = static_cast<const W*>(seg.w) + o * K;
  if constexpr (kVectorized && (kLevers & kGemvLeverBulk) != 0) {
    gemv_bulk_wait();
    row_dot<W, R, true, /*kSharedWeights=*/true>(x, gemv_bulk_rows<W>(bulk_offset, K, 1, warp), K,
                                                 lane, acc);
  } else if constexpr (kVectorized && (kLevers & kGemvLeverDeep) != 0) {
    row_dot_deep<W, R, 1>(x, wr, nullptr, K, lane, acc, acc);
  } else {
    row_dot<W, R, kVectorized>(x, wr, K, lane, acc);
  }
  const float b = seg.bias ? load_float(seg.bias, seg.bias_dtype, o) : 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float total = warp_sum(acc[r]);
    if (lane == 0) {
      float y = total + b;
      if constexpr (kResidual) {
        if (seg.residual) y += seg.residual[r * seg.n + o];
      }
      seg.out[r * seg.n + o] = y;
      if constexpr (kPush) entry[r * seg.n + o] = round_to_bf16_bits(y);
    }
  }
}

// A warp's share of gemv_swiglu_kernel: out[r, o] = silu(x[r] . wg[o] + bg[o]) *
// (x[r] . wu[o] + bu[o]), both rows read by the one warp. Same early return as gemv_warp.
// kLevers with the bulk lever: the gate and up rows are the warp's copies in shared memory
// from byte bulk_offset on (bulk_swiglu_warp_rows).
template <class W, int R, bool kVectorized, int kLevers = 0>
__device__ __forceinline__ void gemv_swiglu_warp(const float* __restrict__ x, int64_t K,
                                                 const GemvSegment& gate, const GemvSegment& up,
                                                 float* __restrict__ out, size_t bulk_offset = 0) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  if (o >= gate.n) return;  // whole warp
  float acc_g[R], acc_u[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc_g[r] = acc_u[r] = 0.0f;
  const W* wg = static_cast<const W*>(gate.w) + o * K;
  const W* wu = static_cast<const W*>(up.w) + o * K;
  if constexpr (kVectorized && (kLevers & kGemvLeverBulk) != 0) {
    gemv_bulk_wait();
    const W* rows = gemv_bulk_rows<W>(bulk_offset, K, 2, warp);
    row_dot<W, R, true, /*kSharedWeights=*/true>(x, rows, K, lane, acc_g);
    row_dot<W, R, true, /*kSharedWeights=*/true>(x, rows + K, K, lane, acc_u);
  } else if constexpr (kVectorized && (kLevers & kGemvLeverDeep) != 0) {
    row_dot_deep<W, R, 2>(x, wg, wu, K, lane, acc_g, acc_u);  // both rows' loads in flight
  } else {
    row_dot<W, R, kVectorized>(x, wg, K, lane, acc_g);
    row_dot<W, R, kVectorized>(x, wu, K, lane, acc_u);
  }
  const float bg = gate.bias ? load_float(gate.bias, gate.bias_dtype, o) : 0.0f;
  const float bu = up.bias ? load_float(up.bias, up.bias_dtype, o) : 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float g = warp_sum(acc_g[r]) + bg, u = warp_sum(acc_u[r]) + bu;
    if (lane == 0) out[r * gate.n + o] = g / (1.0f + expf(-g)) * u;  // as swiglu_kernel
  }
}

}  // namespace attnres::cuda
