// The decode attention sublayer's front in one launch (Backend::prenorm_qkv_rope_store): the
// q, k, v GEMV of cuda_gemv.cu (x from global memory, or computed by the PreNorm prologue of
// cuda_gemv_prenorm.cu), with qk_norm_rope_store's work (cuda_norm_rope.cu) as its epilogue:
// Qwen3's per-head RMSNorm of q and k, the rotate-half RoPE, and the roped k and v written into
// the paged cache. One launch where there were two (three without the prologue).
//
// The difficulty: the per-head norm and RoPE's pairing (i, i + hd / 2) need a whole head's
// outputs in one place, while the GEMV needs many blocks to pull the weights at full
// bandwidth. So a head is a thread block cluster (Hopper) of kRopeCluster = 8 blocks of 8 warps:
// the 64 warps share the head's hd rows (o = 8 * rank + warp, then every 64th: 2 rows per warp
// at hd 128), and each block keeps its outputs in its own shared memory. After one cluster
// barrier, warp 0 of block r (for token row r < R) gathers row r of the head from the 8 blocks
// through distributed shared memory and runs the standalone kernel's per-head code on it
// (cuda_rope_rows.cuh). v heads need no exchange: each warp copies its own rows into v and
// the cache, and the v clusters never reach a cluster barrier. The grid is (hq + 2 hkv)
// clusters: 256 blocks at the 0.6B shape (16 q + 8 k + 8 v heads of 128 rows, K = 1024), about
// what the plain GEMV's 512 single-row-per-warp blocks spread over the 132 SMs of an H100.
//
// Why not a block per head: 32 blocks would leave 100 of 132 SMs idle, and a GEMV's bandwidth
// comes from the SMs' loads in flight; the QKV weights (8.4 MB bf16 at the 0.6B shape, ~2.8 us
// at 3 TB/s) would be read by a quarter of the machine, costing more than the launch saved.
//
// Bits: every output row is cuda_gemv_rows.cuh's gemv_row (the same sum order as gemv_kernel
// and gemv_prenorm_kernel), the prologue is cuda_gemv_prologue.cuh's, the norm, RoPE and the
// cache conversion are cuda_rope_rows.cuh's, which qk_norm_rope_kernel runs too; the cos / sin
// table entries come from the same rope_cos_sin. So q, k, v and the cache equal the two-launch
// path's bit for bit.
//
// The GEMV levers (cuda_gemv_levers.h) have instances of their own (gemv_rope_lever_kernel,
// declared as the other GEMVs' lever kernels): the deep lever reads a warp's rows two at a time
// (rows o and o + 64 together, row_dot_deep: 8 loads in flight at K = 1024 where one row has
// 4), the prefetch lever asks L2 for the warp's rows before the PDL wait and the prologue.
// Each row's sum keeps gemv_row's order, so the bits stay the same.
//
// Shared memory: [the prologue's x: R * K] [head_out: R * hd] [cos, sin: hd / 2 each]
// [gathered: hd]; at most kMaxGemvRopeSharedBytes dynamic (under the 48 KB a kernel gets
// without opting in, beside the prologue's 2 KB static).
#include <cooperative_groups.h>

#include <type_traits>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_gemv_prologue.cuh"
#include "kernels/cuda/cuda_gemv_rows.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_rope_rows.cuh"

namespace attnres::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kRopeCluster = 8;                          // blocks per head (portable size)
constexpr int kRowsPerPass = kRopeCluster * kGemvWarps;  // a head's rows one pass covers
constexpr int64_t kMaxGemvRopeSharedBytes = 44 * 1024;   // dynamic; 4 KB left for static
enum HeadKind : int { kQ = 0, kK = 1, kV = 2 };

// Segment `kind` of q, k, v, read with constant indices only (a run-time index into the
// parameter struct copies it to local memory).
__device__ __forceinline__ GemvSegment select_segment(const GemvSegments& qkv, int kind) {
  GemvSegment seg = qkv.seg[0];
  if (kind == kK) seg = qkv.seg[1];
  if (kind == kV) seg = qkv.seg[2];
  return seg;
}

// Element i of a cache row as store_kv writes it (F32 copied; BF16 rounded as f32_to_bf16).
__device__ __forceinline__ void store_cache_value(void* cache, DType dtype, int64_t i, float x) {
  if (dtype == DType::BF16) {
    store_cached(static_cast<uint16_t*>(cache) + i, x);
  } else {
    store_cached(static_cast<float*>(cache) + i, x);
  }
}

// This cluster's head: the q heads, then the k heads, then the v heads.
struct RopeHead {
  int kind, head;
};
__device__ __forceinline__ RopeHead rope_head_of_block(const RopeStoreParams& rope) {
  const int unit = static_cast<int>(blockIdx.x) / kRopeCluster;
  const int kind = unit < rope.hq ? kQ : unit < rope.hq + rope.hkv ? kK : kV;
  const int head = kind == kQ ? unit : kind == kK ? unit - rope.hq : unit - rope.hq - rope.hkv;
  return {kind, head};
}

// The prefetch lever's share of a warp: its rows of the head to L2 (kernel parameters only, so
// it may run before wait_for_previous_kernel).
template <class W>
__device__ __forceinline__ void prefetch_rope_warp_rows(int64_t K, const GemvSegments& qkv,
                                                        const RopeStoreParams& rope) {
  const int rank = static_cast<int>(cg::this_cluster().block_rank());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const RopeHead h = rope_head_of_block(rope);
  const GemvSegment seg = select_segment(qkv, h.kind);
  const int64_t bytes = K * static_cast<int64_t>(sizeof(W));
  for (int o = rank * kGemvWarps + warp; o < rope.head_dim; o += kRowsPerPass) {
    const int64_t row = static_cast<int64_t>(h.head) * rope.head_dim + o;
    prefetch_to_l2(static_cast<const W*>(seg.w) + row * K, bytes, lane);
  }
}

// The deep lever's loads in flight per lane for a warp's two rows: kGemvDeepLoads, but 6 (3 per
// row) for bf16 weights at 8 rows with x read from global memory (no prologue): a 16-byte bf16
// vector meets 64 floats of x there, and with 8 loads in flight that instance spilled 24 bytes
// under the lever kernels' 128-register cap (nvcc 13.0, sm_90a); with 6 it spills nothing.
// Only when the loads are issued changes, not any sum.
template <class W, int R, bool kPrologue>
constexpr int kRopeDeepLoads =
    std::is_same<W, __nv_bfloat16>::value&& R == 8 && !kPrologue ? 6 : kGemvDeepLoads;

// The deep lever's GEMV of a warp's rows of the head into head_out: rows o and
// o + kRowsPerPass read together, each row's y as gemv_row computes it.
template <class W, int R, int kLoads>
__device__ __forceinline__ void gemv_rope_rows_deep(const float* __restrict__ x, int64_t K,
                                                    const GemvSegment& seg, int head, int hd,
                                                    int first_row, int lane, float* head_out) {
#pragma unroll 1
  for (int o = first_row; o < hd; o += 2 * kRowsPerPass) {
    const int o2 = o + kRowsPerPass;
    const int64_t row = static_cast<int64_t>(head) * hd + o, row2 = row + kRowsPerPass;
    const W* w = static_cast<const W*>(seg.w);
    float acc0[R], acc1[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = 0.0f;
    if (o2 < hd) {
      row_dot_deep<W, R, 2, kLoads>(x, w + row * K, w + row2 * K, K, lane, acc0, acc1);
    } else {
      row_dot_deep<W, R, 1, kLoads>(x, w + row * K, nullptr, K, lane, acc0, acc0);
    }
    const float b0 = seg.bias ? load_float(seg.bias, seg.bias_dtype, row) : 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float y = warp_sum(acc0[r]) + b0;
      if (lane == 0) head_out[r * hd + o] = y;
    }
    if (o2 < hd) {
      const float b1 = seg.bias ? load_float(seg.bias, seg.bias_dtype, row2) : 0.0f;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float y = warp_sum(acc1[r]) + b1;
        if (lane == 0) head_out[r * hd + o2] = y;
      }
    }
  }
}

// kLevers: the mask of the GEMV levers compiled in (cuda_gemv_rows.cuh); 0 for gemv_rope_kernel.
template <class W, int R, bool kPrologue, int kLevers>
__device__ __forceinline__ void gemv_rope_block(const float* __restrict__ x_global,
                                                const GemvPrenorm& prenorm, int prenorm_threads,
                                                int64_t K, const GemvSegments& qkv,
                                                const RopeStoreParams& rope) {
  extern __shared__ __align__(16) float smem[];
  if constexpr ((kLevers & kGemvLeverPrefetch) != 0) prefetch_rope_warp_rows<W>(K, qkv, rope);
  wait_for_previous_kernel();
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int hd = rope.head_dim, half = hd / 2;
  // This cluster's head: the q heads, then the k heads, then the v heads.
  const int unit = static_cast<int>(blockIdx.x) / kRopeCluster;
  const int kind = unit < rope.hq ? kQ : unit < rope.hq + rope.hkv ? kK : kV;
  const int head = kind == kQ ? unit : kind == kK ? unit - rope.hq : unit - rope.hq - rope.hkv;

  float* head_out = kPrologue ? smem + R * K : smem;  // [R, hd]: this block's rows of the head
  float* cos_t = head_out + R * hd;                   // token row `rank`'s table
  float* sin_t = cos_t + half;
  float* gathered = sin_t + half;  // [hd]: token row `rank` of the head, from the cluster
  const bool epilogue_row = kind != kV && rank < R;
  const float* x = x_global;
  if constexpr (kPrologue) {
    prenorm_rows<R>(prenorm, K, prenorm_threads, smem);
    x = smem;
  }

  const GemvSegment seg = select_segment(qkv, kind);
  const int first_row = rank * kGemvWarps + warp;  // this warp's rows of the head: every 64th
  if constexpr ((kLevers & kGemvLeverDeep) != 0) {
    gemv_rope_rows_deep<W, R, kRopeDeepLoads<W, R, kPrologue>>(x, K, seg, head, hd, first_row, lane,
                                                               head_out);
  } else {
// One row at a time, as gemv_kernel's warps.
#pragma unroll 1
    for (int o = first_row; o < hd; o += kRowsPerPass) {
      const int64_t row = static_cast<int64_t>(head) * hd + o;  // in the segment's weight
      float y[R];
      gemv_row<W, R, true>(x, static_cast<const W*>(seg.w) + row * K, K, lane,
                           seg.bias ? load_float(seg.bias, seg.bias_dtype, row) : 0.0f, y);
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < R; ++r) head_out[r * hd + o] = y[r];
      }
    }
  }

  const int64_t row_elems = static_cast<int64_t>(rope.hkv) * hd;  // a cache row: Hkv * hd
  if (kind == kV) {  // the whole cluster: v and its cache copy need no exchange and no barrier
    __syncwarp();    // lane 0's head_out of the warp's own rows
    for (int o = first_row; o < hd; o += kRowsPerPass) {
      const int64_t row = static_cast<int64_t>(head) * hd + o;
      for (int r = lane; r < R; r += 32) {
        const float value = head_out[r * hd + o];
        seg.out[r * seg.n + row] = value;
        store_cache_value(rope.v_cache, rope.cache_dtype, rope.slots[r] * row_elems + row, value);
      }
    }
    return;
  }

  // Token row `rank`'s cos / sin table, here rather than before the GEMV: double sincos calls
  // its slow-path reduction, and a call with the GEMV's values live cost it spills.
  if (epilogue_row) {
    for (int i = threadIdx.x; i < half; i += blockDim.x)
      rope_cos_sin(rope.positions[rank], rope.inv_freq[i], cos_t[i], sin_t[i]);
  }
  cluster.sync();  // every block's head_out (and the table) written and visible cluster-wide
  if (epilogue_row && warp == 0) {
    const int r = rank;
    for (int i = lane; i < hd; i += 32) {
      const int owner = (i / kGemvWarps) % kRopeCluster;  // the block that computed row i
      gathered[i] = cluster.map_shared_rank(head_out, owner)[r * hd + i];
    }
    __syncwarp();
    float* out = seg.out + r * seg.n + static_cast<int64_t>(head) * hd;
    if (kind == kQ) {
      norm_rope_head<float>(gathered, out, nullptr, hd, rope.q_gain, rope.q_gain_dtype, rope.eps,
                            cos_t, sin_t, lane);
    } else {
      const int64_t at = rope.slots[r] * row_elems + static_cast<int64_t>(head) * hd;
      if (rope.cache_dtype == DType::BF16) {
        norm_rope_head(gathered, out, static_cast<uint16_t*>(rope.k_cache) + at, hd, rope.k_gain,
                       rope.k_gain_dtype, rope.eps, cos_t, sin_t, lane);
      } else {
        norm_rope_head(gathered, out, static_cast<float*>(rope.k_cache) + at, hd, rope.k_gain,
                       rope.k_gain_dtype, rope.eps, cos_t, sin_t, lane);
      }
    }
  }
  cluster.sync();  // no block exits while another may still read its head_out
}

template <class W, int R, bool kPrologue>
__global__ void __cluster_dims__(kRopeCluster, 1, 1) __launch_bounds__(kGemvWarps * 32)
    gemv_rope_kernel(const float* __restrict__ x_global, GemvPrenorm prenorm, int prenorm_threads,
                     int64_t K, GemvSegments qkv, RopeStoreParams rope) {
  gemv_rope_block<W, R, kPrologue, 0>(x_global, prenorm, prenorm_threads, K, qkv, rope);
}

template <class W, int R, bool kPrologue, int kLevers>
__global__ void __cluster_dims__(kRopeCluster, 1, 1)
    __launch_bounds__(kGemvWarps * 32, gemv_lever_min_blocks(kLevers))
        gemv_rope_lever_kernel(const float* __restrict__ x_global, GemvPrenorm prenorm,
                               int prenorm_threads, int64_t K, GemvSegments qkv,
                               RopeStoreParams rope) {
  gemv_rope_block<W, R, kPrologue, kLevers>(x_global, prenorm, prenorm_threads, K, qkv, rope);
}

int64_t shared_floats(const GemvRopeArgs& a) {
  const int64_t hd = a.rope.head_dim;
  return (a.prenorm ? a.rows * a.K : 0) + a.rows * hd + 2 * hd;
}

template <class W, int R>
void launch_rows(const GemvRopeArgs& a, cudaStream_t stream) {
  const RopeStoreParams& p = a.rope;
  const unsigned grid = static_cast<unsigned>((p.hq + 2 * p.hkv) * kRopeCluster);
  const size_t smem = static_cast<size_t>(shared_floats(a)) * sizeof(float);
  // No bulk instance: the QKV kernel walks a head's rows in turn behind its cluster barriers.
  const int levers = gemv_launch_levers(gemv_levers_now(), SIZE_MAX);
  if (levers) {
    dispatch_gemv_levers<false>(levers, [&](auto l) {
      constexpr int L = decltype(l)::value;
      if (a.prenorm) {
        launch_kernel(gemv_rope_lever_kernel<W, R, true, L>, grid, dim3(kGemvWarps * 32), smem,
                      stream, static_cast<const float*>(nullptr), *a.prenorm,
                      row_block_threads(a.K), a.K, a.qkv, p);
      } else {
        launch_kernel(gemv_rope_lever_kernel<W, R, false, L>, grid, dim3(kGemvWarps * 32), smem,
                      stream, a.x, GemvPrenorm{}, 0, a.K, a.qkv, p);
      }
    });
  } else if (a.prenorm) {
    // The block size of the standalone PreNorm kernels, whose reduction order the prologue keeps.
    launch_kernel(gemv_rope_kernel<W, R, true>, grid, dim3(kGemvWarps * 32), smem, stream,
                  static_cast<const float*>(nullptr), *a.prenorm, row_block_threads(a.K), a.K,
                  a.qkv, p);
  } else {
    launch_kernel(gemv_rope_kernel<W, R, false>, grid, dim3(kGemvWarps * 32), smem, stream, a.x,
                  GemvPrenorm{}, 0, a.K, a.qkv, p);
  }
}

}  // namespace

bool gemv_rope_takes(const GemvRopeArgs& a) {
  const RopeStoreParams& p = a.rope;
  if (a.rows < 1 || a.rows > kMaxGemvRows) return false;
  if (a.w_dtype != DType::F32 && a.w_dtype != DType::BF16) return false;
  const int64_t vec = a.w_dtype == DType::F32 ? 4 : 8;  // weights per 16-byte vector
  if (a.K <= 0 || a.K % vec != 0) return false;
  if (a.x && reinterpret_cast<uintptr_t>(a.x) % 16 != 0) return false;
  if (a.prenorm && !gemv_prenorm_takes(a.rows, a.K)) return false;
  if (p.head_dim <= 0 || p.head_dim % 2 != 0 || p.head_dim > kMaxGemvRopeHeadDim) return false;
  if (p.hq <= 0 || p.hkv <= 0 || a.qkv.count != 3) return false;
  const int64_t widths[3] = {static_cast<int64_t>(p.hq) * p.head_dim,
                             static_cast<int64_t>(p.hkv) * p.head_dim,
                             static_cast<int64_t>(p.hkv) * p.head_dim};
  for (int s = 0; s < 3; ++s) {
    const GemvSegment& seg = a.qkv.seg[s];
    if (seg.n != widths[s] || seg.residual) return false;
    if (reinterpret_cast<uintptr_t>(seg.w) % 16 != 0) return false;
  }
  if (p.cache_dtype != DType::F32 && p.cache_dtype != DType::BF16) return false;
  return shared_floats(a) * static_cast<int64_t>(sizeof(float)) <= kMaxGemvRopeSharedBytes;
}

void launch_gemv_rope(const GemvRopeArgs& a, cudaStream_t stream) {
  const RopeStoreParams& p = a.rope;
  ATTNRES_CHECK((a.x == nullptr) != (a.prenorm == nullptr),
                "gemv_rope: exactly one of x and the PreNorm prologue");
  ATTNRES_CHECK(gemv_rope_takes(a), "gemv_rope: arguments the kernel does not take");
  ATTNRES_CHECK(p.num_tokens == a.rows && p.q == a.qkv.seg[0].out && p.k == a.qkv.seg[1].out &&
                    p.v == a.qkv.seg[2].out,
                "gemv_rope: q, k, v must be the GEMV's outputs, one per row");
  ATTNRES_CHECK(p.positions && p.slots && p.inv_freq && p.k_cache && p.v_cache,
                "gemv_rope: positions, slots, inv_freq and the cache are required");
  dispatch_gemv_rows(a.rows, [&](auto r) {
    constexpr int R = decltype(r)::value;
    if (a.w_dtype == DType::F32) {
      launch_rows<float, R>(a, stream);
    } else {
      launch_rows<__nv_bfloat16, R>(a, stream);
    }
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
