// Causal GQA attention of prefill chunks on tensor cores, FlashAttention-2 style, over the
// paged KV cache (layout: cuda_attention.cu's header).
//
// Work: one CTA per (query head, tile). A tile (PrefillTile, planned on the host by
// cuda_attention_dispatch.h) is up to 64 consecutive query rows of one sequence; the CTA walks
// that sequence's keys 0..key_end (key_end = the tile's largest position + 1) in tiles of 64
// keys read through the block table, so the causal upper triangle beyond the tile's last row
// is never read, and masks (key > the row's position) only the key tiles that reach past the
// tile's smallest position (the cached prefix before the chunk is read unmasked).
// One query head per CTA, not the whole GQA group: the group's CTAs read the same K/V tile
// close together in time, from L2 (the 0.6B's group is 2), and a tile stays token-aligned,
// so its causal bound and the plan do not depend on the head layout. The grid runs the heads
// of a tile next to each other (x = head) so that every head's CTA of a tile reads the same
// K/V while it is in L2, and the tiles last first (y counts down the plan): within a sequence
// the later tiles see the most keys, and starting them first shortens the tail.
//
// Inside a CTA: 4 warps, each 16 of the 64 query rows, with mma.sync m16n8k16 (bf16 in, f32
// accumulate):
//   per key tile: K, V rows staged into shared memory as bf16 (a bf16 cache copied as is, an
//   f32 cache rounded to nearest even while staging; rows padded by 16 bytes so ldmatrix's 8
//   row addresses fall in distinct banks);
//   S = Q K^T (Q rounded to bf16 once, held in registers as A fragments; K as B fragments by
//   ldmatrix), scaled by scale * log2(e), masked to -inf;
//   online softmax per row in f32 (running max m, running sum l of the f32 weights):
//     m' = max(m, max_j s_j);  c = 2^(m - m');  p_j = 2^(s_j - m');  l = l c + sum_j p_j;
//     O = O c + bf16(p) V   (the S accumulators are P's A fragments as they lie; V's B
//   fragments by ldmatrix.trans);
//   a row's 4 lanes (the quad holding it) combine max and sum by xor shuffles.
// At the end O / l goes to out. Rounding: Q, K, V (f32 cache) and P are bf16 in the products,
// everything else f32; a row that sees k keys is off the f32 result by at most 2^-9 of the
// weighted mean of |v| over them (P's rounding; Q, K, V rounding aside), the tests' bound.
// Deterministic: fixed orders, no atomics; a row's result does not depend on its batch-mates.
#include <cuda_bf16.h>

#include <type_traits>

#include "kernels/cuda/cuda_activation.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * 32;
constexpr int kRowsPerWarp = 16;  // an m16 MMA tile
static_assert(kPrefillWarps * kRowsPerWarp == kPrefillTileRows, "a warp per 16 rows of a tile");
constexpr int kTileKeys = 64;
constexpr float kLog2e = 1.4426950408889634f;

// Two f32 rounded to nearest even into one bf16x2 word, lo in the low half (the earlier
// column of an MMA fragment).
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Four 8x8 bf16 matrices: lanes 8i..8i+7 give the row addresses of matrix i; register i gets
// matrix i's fragment (lane l: row l / 4, columns 2 (l % 4) and +1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const uint16_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}

// The same, transposed: lane l gets rows 2 (l % 4) and +1 of column l / 4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const uint16_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(row)));
}

// d += a b for one m16n8k16 tile: a the 16x16 A fragment, (b0, b1) the 16x8 B fragment.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Keys [n0, n0 + kTileKeys) of one KV head into smem [kTileKeys][kStride] as bf16; keys at or
// past key_end as zeros (V's zeros keep 0 * garbage out of O; their scores are masked). A
// thread moves 16-byte chunks: one bf16 load, or two f32 loads rounded.
template <class S, int HD, int kStride>
__device__ __forceinline__ void stage_keys(const S* __restrict__ cache,
                                           const int32_t* __restrict__ table, int block_size,
                                           int64_t row_elems, int64_t head_offset, int n0,
                                           int key_end, uint16_t* smem) {
  constexpr int kChunksPerKey = HD / 8;
  constexpr int kIters = kTileKeys * kChunksPerKey / kPrefillThreads;
  static_assert(kIters * kPrefillThreads == kTileKeys * kChunksPerKey, "whole chunks");
#pragma unroll
  for (int it = 0; it < kIters; ++it) {
    const int i = it * kPrefillThreads + threadIdx.x;
    const int key_in_tile = i / kChunksPerKey, chunk = i % kChunksPerKey;
    const int key = n0 + key_in_tile;
    uint4 packed = make_uint4(0u, 0u, 0u, 0u);
    if (key < key_end) {
      const int64_t slot =
          static_cast<int64_t>(table[key / block_size]) * block_size + key % block_size;
      const S* src = cache + slot * row_elems + head_offset + chunk * 8;
      if constexpr (std::is_same_v<S, uint16_t>) {
        packed = __ldg(reinterpret_cast<const uint4*>(src));
      } else {
        const float4 lo = __ldg(reinterpret_cast<const float4*>(src));
        const float4 hi = __ldg(reinterpret_cast<const float4*>(src) + 1);
        packed = make_uint4(pack_bf16x2(lo.x, lo.y), pack_bf16x2(lo.z, lo.w),
                            pack_bf16x2(hi.x, hi.y), pack_bf16x2(hi.z, hi.w));
      }
    }
    *reinterpret_cast<uint4*>(smem + key_in_tile * kStride + chunk * 8) = packed;
  }
}

// Max / sum over the 4 lanes of a quad (the lanes holding one row of an MMA accumulator).
__device__ __forceinline__ float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// One CTA: query head blockIdx.x, tile num_tiles - 1 - blockIdx.y. S: float or uint16_t (bf16
// bits). Lane l of warp w holds rows w * 16 + l / 4 ("row 0") and + 8 ("row 1") of the tile, and in
// each 8-column accumulator columns 2 (l % 4) and +1 (the m16n8 C layout).
// A lane's share of its two rows' output, O / l: columns j * 8 + quad_col and + 1 of each
// 8-column accumulator, two elements per store (O: float, or uint16_t bf16 bits).
template <class O, int kOutCols>
__device__ __forceinline__ void store_out_rows(O* out, int64_t out0, int64_t out1,
                                               const float (&o)[kOutCols][4], float inv0,
                                               float inv1, bool valid0, bool valid1, int quad_col) {
#pragma unroll
  for (int j = 0; j < kOutCols; ++j) {
    const int c = j * 8 + quad_col;
    if (valid0) store_activation_pair(out + out0 + c, o[j][0] * inv0, o[j][1] * inv0);
    if (valid1) store_activation_pair(out + out1 + c, o[j][2] * inv1, o[j][3] * inv1);
  }
}

template <class S, int HD>
__global__ void __launch_bounds__(kPrefillThreads, 2)
    prefill_attention_kernel(const PrefillAttentionArgs a) {
  wait_for_previous_kernel();
  constexpr int kStride = HD + 8;            // bf16 per smem row: +16 bytes against conflicts
  constexpr int kDimSteps = HD / 16;         // k-steps of S = Q K^T
  constexpr int kKeyCols = kTileKeys / 8;    // 8-key accumulators of S
  constexpr int kKeySteps = kTileKeys / 16;  // k-steps of O += P V
  constexpr int kOutCols = HD / 8;           // 8-column accumulators of O
  __shared__ alignas(16) uint16_t k_smem[kTileKeys * kStride];
  __shared__ alignas(16) uint16_t v_smem[kTileKeys * kStride];

  const PrefillTile tile = a.tiles[a.num_tiles - 1 - static_cast<int>(blockIdx.y)];
  const int head = blockIdx.x;
  const int kv_head = head / (a.hq / a.hkv);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int quad_row = lane >> 2, quad_col = (lane & 3) * 2;
  const int row0 = warp * kRowsPerWarp + quad_row, row1 = row0 + 8;
  const bool valid0 = row0 < tile.num_rows, valid1 = row1 < tile.num_rows;
  // A padding row (past num_rows) takes position -1: it sees no key and is never written.
  const int pos0 = valid0 ? a.positions[tile.first_row + row0] : -1;
  const int pos1 = valid1 ? a.positions[tile.first_row + row1] : -1;

  // Q as A fragments, rounded to bf16 once: a[0] row 0, columns c, c + 1; a[1] row 1; a[2],
  // a[3] the same 8 columns on (c = 16 ks + 2 (lane % 4)).
  uint32_t qf[kDimSteps][4];
  {
    const float* q0 = a.q + (static_cast<int64_t>(tile.first_row + row0) * a.hq + head) * HD;
    const float* q1 = q0 + static_cast<int64_t>(8) * a.hq * HD;
    const float2 zero = make_float2(0.0f, 0.0f);
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
      const int c = ks * 16 + quad_col;
      const float2 x00 = valid0 ? *reinterpret_cast<const float2*>(q0 + c) : zero;
      const float2 x10 = valid1 ? *reinterpret_cast<const float2*>(q1 + c) : zero;
      const float2 x01 = valid0 ? *reinterpret_cast<const float2*>(q0 + c + 8) : zero;
      const float2 x11 = valid1 ? *reinterpret_cast<const float2*>(q1 + c + 8) : zero;
      qf[ks][0] = pack_bf16x2(x00.x, x00.y);
      qf[ks][1] = pack_bf16x2(x10.x, x10.y);
      qf[ks][2] = pack_bf16x2(x01.x, x01.y);
      qf[ks][3] = pack_bf16x2(x11.x, x11.y);
    }
  }

  float o[kOutCols][4];
#pragma unroll
  for (int j = 0; j < kOutCols; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY;  // running max of the scaled scores (log2 units)
  float l0 = 0.0f, l1 = 0.0f;            // this lane's share of the running sum

  const float scale_log2 = a.scale * kLog2e;
  const S* k_cache = static_cast<const S*>(a.k_cache);
  const S* v_cache = static_cast<const S*>(a.v_cache);
  const int32_t* table = a.block_table + static_cast<int64_t>(tile.seq) * a.max_blocks;
  const int64_t row_elems = static_cast<int64_t>(a.hkv) * HD;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * HD;

  for (int n0 = 0; n0 < tile.key_end; n0 += kTileKeys) {
    __syncthreads();  // every warp is done reading the previous key tile
    stage_keys<S, HD, kStride>(k_cache, table, a.block_size, row_elems, head_offset, n0,
                               tile.key_end, k_smem);
    stage_keys<S, HD, kStride>(v_cache, table, a.block_size, row_elems, head_offset, n0,
                               tile.key_end, v_smem);
    __syncthreads();

    // S = Q K^T. ldmatrix x4 over 16 keys x 16 dims: matrices (keys +0, dims +0), (+0, +8),
    // (+8, +0), (+8, +8) = B fragments (b0, b1) of key columns 2 kp and 2 kp + 1.
    float s[kKeyCols][4];
#pragma unroll
    for (int j = 0; j < kKeyCols; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < kDimSteps; ++ks) {
#pragma unroll
      for (int kp = 0; kp < kKeyCols / 2; ++kp) {
        const int key = kp * 16 + (lane & 7) + ((lane >> 4) << 3);
        const int dim = ks * 16 + ((lane >> 3) & 1) * 8;
        uint32_t b[4];
        ldmatrix_x4(b, k_smem + key * kStride + dim);
        mma_bf16(s[2 * kp], qf[ks], b[0], b[1]);
        mma_bf16(s[2 * kp + 1], qf[ks], b[2], b[3]);
      }
    }

    // Scale into log2 units; mask keys past a row's position (and so past key_end) where this
    // key tile reaches past the tile's smallest position.
    const bool needs_mask = n0 + kTileKeys - 1 > tile.min_position;
#pragma unroll
    for (int j = 0; j < kKeyCols; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + j * 8 + quad_col + (e & 1);
        const int pos = e < 2 ? pos0 : pos1;
        s[j][e] = needs_mask && key > pos ? -INFINITY : s[j][e] * scale_log2;
      }

    // Online softmax. A row that has seen no key yet keeps m = -inf and exponentiates
    // against 0 instead (so -inf - -inf never makes a NaN; its weights are all 0).
    float max0 = m0, max1 = m1;
#pragma unroll
    for (int j = 0; j < kKeyCols; ++j) {
      max0 = fmaxf(max0, fmaxf(s[j][0], s[j][1]));
      max1 = fmaxf(max1, fmaxf(s[j][2], s[j][3]));
    }
    max0 = quad_max(max0);
    max1 = quad_max(max1);
    const float base0 = max0 == -INFINITY ? 0.0f : max0;
    const float base1 = max1 == -INFINITY ? 0.0f : max1;
    const float c0 = exp2f(m0 - base0), c1 = exp2f(m1 - base1);  // 0 while m = -inf
    m0 = max0;
    m1 = max1;
    l0 *= c0;
    l1 *= c1;
#pragma unroll
    for (int j = 0; j < kOutCols; ++j) {
      o[j][0] *= c0;
      o[j][1] *= c0;
      o[j][2] *= c1;
      o[j][3] *= c1;
    }
#pragma unroll
    for (int j = 0; j < kKeyCols; ++j) {
      s[j][0] = exp2f(s[j][0] - base0);
      s[j][1] = exp2f(s[j][1] - base0);
      s[j][2] = exp2f(s[j][2] - base1);
      s[j][3] = exp2f(s[j][3] - base1);
      l0 += s[j][0] + s[j][1];
      l1 += s[j][2] + s[j][3];
    }

    // O += P V. P's A fragment for keys 16 kk..+15 is S columns 2 kk and 2 kk + 1 as they
    // lie; ldmatrix x4 trans over 16 keys x 16 dims: matrices (keys +0, dims +0), (+8, +0),
    // (+0, +8), (+8, +8) = B fragments (b0, b1) of output columns 2 dp and 2 dp + 1.
#pragma unroll
    for (int kk = 0; kk < kKeySteps; ++kk) {
      const uint32_t p[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]),
                             pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                             pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kOutCols / 2; ++dp) {
        const int key = kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
        const int dim = dp * 16 + (lane >> 4) * 8;
        uint32_t b[4];
        ldmatrix_x4_trans(b, v_smem + key * kStride + dim);
        mma_bf16(o[2 * dp], p, b[0], b[1]);
        mma_bf16(o[2 * dp + 1], p, b[2], b[3]);
      }
    }
  }

  // Each lane summed its own columns: the quad's total is the row's.
  const float inv0 = 1.0f / quad_sum(l0), inv1 = 1.0f / quad_sum(l1);
  const int64_t out0 = (static_cast<int64_t>(tile.first_row + row0) * a.hq + head) * HD;
  const int64_t out1 = out0 + static_cast<int64_t>(8) * a.hq * HD;
  // bf16 out (o_proj's GEMM input, cuda_activation.cuh): the same f32 values, rounded.
  if (a.out_dtype == DType::BF16) {
    store_out_rows(static_cast<uint16_t*>(a.out), out0, out1, o, inv0, inv1, valid0, valid1,
                   quad_col);
  } else {
    store_out_rows(static_cast<float*>(a.out), out0, out1, o, inv0, inv1, valid0, valid1, quad_col);
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

template <class S>
void launch_for_head_dim(const PrefillAttentionArgs& args, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(args.hq), static_cast<unsigned>(args.num_tiles));
  if (args.head_dim == 64) {
    launch_kernel(prefill_attention_kernel<S, 64>, grid, dim3(kPrefillThreads), 0, stream, args);
  } else {
    launch_kernel(prefill_attention_kernel<S, 128>, grid, dim3(kPrefillThreads), 0, stream, args);
  }
}

}  // namespace

bool prefill_attention_supports(int head_dim, DType kv_dtype, const void* k_cache,
                                const void* v_cache) {
  return (head_dim == 64 || head_dim == 128) &&
         (kv_dtype == DType::F32 || kv_dtype == DType::BF16) && aligned(k_cache, 16) &&
         aligned(v_cache, 16);
}

void launch_prefill_attention(const PrefillAttentionArgs& args, cudaStream_t stream) {
  if (args.num_tiles == 0 || args.hq == 0) return;
  ATTNRES_CHECK(
      prefill_attention_supports(args.head_dim, args.kv_dtype, args.k_cache, args.v_cache),
      "prefill attention: head_dim " + std::to_string(args.head_dim) + ", " +
          std::string(dtype_name(args.kv_dtype)) +
          " cache: needs head_dim 64 or 128, an F32 or BF16 cache, 16-byte aligned");
  // q and out are read / written two elements at a time.
  ATTNRES_CHECK(aligned(args.q, 8) && aligned(args.out, args.out_dtype == DType::BF16 ? 4 : 8),
                "prefill attention: q must be 8-byte aligned, out aligned to two elements");
  ATTNRES_CHECK(args.out_dtype == DType::F32 || args.out_dtype == DType::BF16,
                "prefill attention: out must be F32 or BF16");
  ATTNRES_CHECK(args.hkv > 0 && args.hq % args.hkv == 0 && args.block_size > 0,
                "prefill attention: bad head / block configuration");
  ATTNRES_CHECK(args.num_tiles <= 65535,  // grid y
                "prefill attention: " + std::to_string(args.num_tiles) +
                    " tiles in one step, more than 65535 (4M query rows)");
  if (args.kv_dtype == DType::BF16) {
    launch_for_head_dim<uint16_t>(args, stream);
  } else {
    launch_for_head_dim<float>(args, stream);
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
