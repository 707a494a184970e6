// Row access for the depth kernels (cuda_depth_mix.cu, cuda_depth_weights.cu): a thread reads
// V consecutive elements of a row at a time, widened to f32 in registers. V = 8 is the vector
// path: a bf16 bank row gives its 8 elements in one 16-byte load, an f32 row (the bank, o,
// queries, the partial) in two. V = 1 is the scalar path, for rows whose length is not a
// multiple of 8 or whose pointers are not 16-byte aligned (the launcher picks; see
// rows_allow_vectors). Both paths give each element exactly its stored value (bf16 widens by
// a shift), so a bf16 bank reads as an f32 bank of the rounded values.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_bf16_round.h"
#include "kernels/cuda/cuda_common.cuh"

namespace attnres::cuda {

// Elements per thread per iteration on the vector path.
constexpr int kDepthVector = 8;
// The most threads a vector-path block has (its rows take d / 8 threads, looping past this):
// the 8-wide registers need more than the 64 per thread a 1024-thread block leaves (ptxas
// spilled depth_phase1_kernel<8> and the Phase-2 kernel at 64). Declared in the kernels'
// __launch_bounds__ through depth_block_threads.
constexpr int kMaxDepthVectorThreads = 256;

// The __launch_bounds__ of a depth kernel reading V elements per thread.
template <int V>
constexpr int depth_block_threads() {
  return V == 1 ? kMaxRowThreads : kMaxDepthVectorThreads;
}

// Threads per block for rows of d elements read V at a time.
inline int depth_row_threads(int64_t d, bool vectors) {
  return vectors ? row_block_threads(d / kDepthVector, kMaxDepthVectorThreads)
                 : row_block_threads(d);
}

// x[k] = row[i + k] for k < V, widened to f32. row + i must be 16-byte aligned when V == 8.
template <int V>
__device__ __forceinline__ void load_row(const float* row, int64_t i, float (&x)[V]) {
  if constexpr (V == 1) {
    x[0] = row[i];
  } else {
    static_assert(V == 8, "rows are read 1 or 8 elements at a time");
    const float4 a = *reinterpret_cast<const float4*>(row + i);
    const float4 b = *reinterpret_cast<const float4*>(row + i + 4);
    x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w;
    x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
  }
}

template <int V>
__device__ __forceinline__ void load_row(const __nv_bfloat16* row, int64_t i, float (&x)[V]) {
  if constexpr (V == 1) {
    x[0] = __bfloat162float(row[i]);
  } else {
    static_assert(V == 8, "rows are read 1 or 8 elements at a time");
    // One 16-byte load; each 32-bit word holds two bf16, the lower-addressed one in the low
    // half (little-endian). Widening is the bit pattern shifted into the high half.
    const uint4 raw = *reinterpret_cast<const uint4*>(row + i);
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      x[2 * k] = __uint_as_float(w[k] << 16);
      x[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  }
}

// row[i + k] = x[k] for k < V (f32 rows: o, out). row + i 16-byte aligned when V == 8.
template <int V>
__device__ __forceinline__ void store_row(float* row, int64_t i, const float (&x)[V]) {
  if constexpr (V == 1) {
    row[i] = x[0];
  } else {
    static_assert(V == 8, "rows are written 1 or 8 elements at a time");
    *reinterpret_cast<float4*>(row + i) = make_float4(x[0], x[1], x[2], x[3]);
    *reinterpret_cast<float4*>(row + i + 4) = make_float4(x[4], x[5], x[6], x[7]);
  }
}

// The same into a bf16 row (uint16_t bits; the Phase-2 output as a GEMM's input), each element
// rounded by round_to_bf16_bits (cuda_activation.cuh). row + i 16-byte aligned when V == 8.
template <int V>
__device__ __forceinline__ void store_row(uint16_t* row, int64_t i, const float (&x)[V]) {
  if constexpr (V == 1) {
    row[i] = round_to_bf16_bits(x[0]);
  } else {
    static_assert(V == 8, "rows are written 1 or 8 elements at a time");
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t lo = round_to_bf16_bits(x[2 * k]), hi = round_to_bf16_bits(x[2 * k + 1]);
      w[k] = lo | hi << 16;  // little-endian: the lower-addressed element in the low half
    }
    *reinterpret_cast<uint4*>(row + i) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The most Phase-1 queries one launch takes (the kernels' S, registers indexed by constants);
// more are launched in groups of this many, like the CPU.
constexpr int kMaxFusedQueries = 8;

// Calls f(std::integral_constant<int, S>{}) with S = queries, 1..kMaxFusedQueries.
static_assert(kMaxFusedQueries == 8, "dispatch_1_to_8 covers the query counts of a launch");
template <class F>
void dispatch_phase1_queries(int queries, F&& f) {
  dispatch_1_to_8(queries, std::forward<F>(f));
}

// The source value of V elements from i of a bank row: the row widened to f32, gated by
// sigmoid(gate logits) under pre_gated (gate non-null).
template <int V, class B>
__device__ __forceinline__ void load_source(const B* row, const float* gate, int64_t i,
                                            float (&x)[V]) {
  load_row<V>(row, i, x);
  if (gate) {
    float g[V];
    load_row<V>(gate, i, g);
#pragma unroll
    for (int k = 0; k < V; ++k) x[k] = x[k] / (1.0f + expf(-g[k]));
  }
}

// One bank entry's online-softmax step of Phase 1 for one query (entry j, its logit): the
// running max m and sum s take it in; keep and w are the factors of o = o * keep + w * source
// (j == 0 starts o: keep 0; a new max rescales what was accumulated).
__device__ __forceinline__ void phase1_online_step(int j, float logit, float& m, float& s,
                                                   float& keep, float& w) {
  keep = 1.0f;
  w = 1.0f;
  if (j == 0) {
    keep = 0.0f;
    m = logit;
    s = 1.0f;
  } else if (logit > m) {
    keep = expf(m - logit);
    s = s * keep + 1.0f;
    m = logit;
  } else {
    w = expf(logit - m);
    s += w;
  }
}

// The C of depth_phase1_kernel for rows of d read V at a time by `threads` threads: the
// chunks each thread owns, when its share of o fits in registers (0 otherwise). Two chunks
// only on the scalar path: at V = 8 they need 2 * S * 8 accumulators, which spill at S >= 7
// (nvcc 13, sm_90a, -Xptxas -v).
inline int phase1_held_chunks(int64_t d, int V, int threads) {
  const int64_t per_pass = static_cast<int64_t>(V) * threads;
  const int64_t chunks = (d + per_pass - 1) / per_pass;
  return chunks <= (V == 1 ? 2 : 1) ? static_cast<int>(chunks) : 0;
}

// Whether the vector path may read rows of d elements: d a multiple of 8 and every base
// pointer 16-byte aligned (then every row start and every 8-element chunk is, for f32 and bf16
// alike: row offsets are multiples of d elements). Null pointers (absent inputs) pass.
inline bool rows_allow_vectors(int64_t d, std::initializer_list<const void*> bases) {
  if (d % kDepthVector != 0) return false;
  for (const void* p : bases)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// Calls f(B{}) with B the storage type of a depth bank: float or __nv_bfloat16 (the dtypes of
// cuda_backend_capabilities().depth_bank_dtypes; the ops refuse any other before launching).
template <class F>
void dispatch_bank_dtype(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::F32:
      f(float{});
      return;
    case DType::BF16:
      f(__nv_bfloat16{});
      return;
    default:
      throw Error(std::string(what) + ": a depth bank of " + std::string(dtype_name(dtype)) +
                  " is not supported (F32, BF16)");
  }
}

}  // namespace attnres::cuda
