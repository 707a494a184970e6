// The GEMV bulk lever (ATTNRES_CUDA_GEMV_BULK, cuda_gemv_levers.h): a warp's weight rows copied
// into shared memory by the TMA (cp.async.bulk, compute capability 9.0) before the PDL wait,
// then read from there by row_dot with the same lane split, operations and order, so the
// outputs are the bits of the kernels without the lever.
//
// Why: the GEMVs without a lever keep at most 4 16-byte loads per lane in flight (~2 MB over the
// GPU for o_proj / down, ~4 MB needed to stream at the copy rate), and issue the first only once
// the kernel ahead has finished and the PreNorm prologue's barriers are passed. A bulk copy of a
// whole row is one instruction; a block's 8 warps put all their weight bytes in flight at once,
// and under programmatic dependent launch they do it while the kernel ahead still runs (weights
// do not change within a step, and only the kernel parameters are read before the wait).
//
// Layout: the dynamic shared memory from byte `offset` (after the prologue's normed rows, if
// any) holds kGemvWarps x rows-per-warp rows of K weights, warp w's first; one mbarrier per warp
// (static shared memory), initialised and armed by the warp's lane 0, which issues the copies;
// every lane of the warp waits on it (phase 0: each barrier completes once per launch).
#pragma once

#include <cuda/ptx>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_common.cuh"

namespace attnres::cuda {

constexpr int kGemvBulkWarps = 8;  // kGemvWarps (cuda_gemv_rows.cuh), which includes this file
// The most dynamic shared memory a bulk launch asks for (the H100 / H200 opt-in limit is 227 KB
// per block); a launch needing more runs without the lever.
constexpr size_t kMaxGemvBulkSharedBytes = 200 * 1024;
// Dynamic shared memory a launch may use without opting in.
constexpr size_t kDefaultDynamicSharedBytes = 48 * 1024;

// Where the weight rows start: past `x_bytes` (the prologue's rows), 128-byte aligned (a bulk
// copy's destination must be 16-byte aligned; 128 keeps each row on its own lines).
__host__ __device__ constexpr size_t gemv_bulk_offset(size_t x_bytes) { return (x_bytes + 127) / 128 * 128; }

// The dynamic shared memory of a bulk launch: the prologue's rows, then the weight rows.
inline size_t gemv_bulk_shared_bytes(size_t x_bytes, int64_t K, size_t weight_bytes,
                                     int rows_per_warp) {
  return gemv_bulk_offset(x_bytes) +
         static_cast<size_t>(kGemvBulkWarps) * rows_per_warp * static_cast<size_t>(K) * weight_bytes;
}

// Lets `kernel` launch with `bytes` of dynamic shared memory (past the default, an opt-in per
// kernel and device; a host call, not a stream operation, so also allowed while capturing).
template <class... Params>
void allow_dynamic_shared(void (*kernel)(Params...), size_t bytes) {
  if (bytes <= kDefaultDynamicSharedBytes) return;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(bytes)));
}

// Warp `warp`'s mbarrier.
__device__ __forceinline__ uint64_t* gemv_bulk_barrier(int warp) {
  __shared__ uint64_t barriers[kGemvBulkWarps];
  return &barriers[warp];
}

// Warp `warp`'s first weight row in shared memory (its rows follow, K apart).
template <class W>
__device__ __forceinline__ W* gemv_bulk_rows(size_t offset, int64_t K, int rows_per_warp,
                                             int warp) {
  extern __shared__ __align__(128) unsigned char gemv_bulk_dynamic[];
  return reinterpret_cast<W*>(gemv_bulk_dynamic + offset) +
         static_cast<int64_t>(warp) * rows_per_warp * K;
}

// Lane 0 of the warp: arms the warp's barrier for the bytes of rows src0 (and src1, if not
// null) and has the TMA copy them to gemv_bulk_rows. Every lane calls it (the __syncwarp makes
// the initialised barrier visible to the lanes that wait on it). Rows of K * sizeof(W) bytes, a
// multiple of 16, from 16-byte aligned addresses (the vector path's conditions).
template <class W>
__device__ __forceinline__ void gemv_bulk_issue(size_t offset, int64_t K, const W* src0,
                                                const W* src1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) {
    uint64_t* bar = gemv_bulk_barrier(warp);
    W* dst = gemv_bulk_rows<W>(offset, K, src1 ? 2 : 1, warp);
    const uint32_t bytes = static_cast<uint32_t>(K * static_cast<int64_t>(sizeof(W)));
    ::cuda::ptx::mbarrier_init(bar, 1);
    ::cuda::ptx::fence_mbarrier_init(::cuda::ptx::sem_release, ::cuda::ptx::scope_cluster);
    ::cuda::ptx::mbarrier_arrive_expect_tx(::cuda::ptx::sem_release, ::cuda::ptx::scope_cta,
                                         ::cuda::ptx::space_shared, bar, src1 ? 2 * bytes : bytes);
    ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, dst, src0, bytes,
                             bar);
    if (src1)
      ::cuda::ptx::cp_async_bulk(::cuda::ptx::space_cluster, ::cuda::ptx::space_global, dst + K, src1,
                               bytes, bar);
  }
  __syncwarp();
#endif
}

// Every lane of the warp: waits until the warp's rows have landed (the barrier's phase 0).
__device__ __forceinline__ void gemv_bulk_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint64_t* bar = gemv_bulk_barrier(threadIdx.x >> 5);
  while (!::cuda::ptx::mbarrier_try_wait_parity(bar, 0)) {
  }
#endif
}

}  // namespace attnres::cuda
