// Device helpers shared by the kernel files: reading stored weights as f32, warp and block
// reductions, and the host-side dispatch from a runtime DType to a kernel template.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "engine/core/dtype.h"
#include "engine/core/error.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_launch.h"

namespace attnres::cuda {

// --- programmatic dependent launch (cuda_launch.h) ---
// Every kernel calls this first, before it reads or writes global memory. griddepcontrol.wait
// returns once the kernel ahead in the stream has completed and its writes are visible (at
// once for a launch without the PDL attribute, or after a memcpy / memset / cuBLAS kernel,
// which the runtime serialises as before). launch_dependents then lets the next kernel be
// scheduled already: its blocks run only up to their own wait meanwhile, so whatever this
// kernel writes after the trigger is complete before any of them reads it or overwrites what
// this kernel reads. A dependent is scheduled only once every block of this grid has
// triggered, i.e. is resident or done, so its waiting blocks never keep ours off the SMs.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...) with the launch attribute
// `attribute` (none where null) and counts the launch: what launch_kernel and
// launch_cooperative_kernel share.
template <class... Params, class... Args>
void launch_kernel_with(const cudaLaunchAttribute* attribute, void (*kernel)(Params...), dim3 grid,
                        dim3 block, size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  LaunchContext* context = current_launch_context();
  cudaLaunchAttribute attrs[1] = {};
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  if (attribute) {
    attrs[0] = *attribute;
    config.attrs = attrs;
    config.numAttrs = 1;
  }
  if (context) context->kernels.fetch_add(1, std::memory_order_relaxed);
  const cudaError_t err = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  if (err != cudaSuccess) {
    cudaGetLastError();  // reported here, not again by the launcher's CUDA_CHECK_LAUNCH
    throw_cuda_error(err, "cudaLaunchKernelEx", __FILE__, __LINE__);
  }
}

// Launches kernel<<<grid, block, shared_bytes, stream>>>(args...) with the PDL attribute when
// the current backend's launch context asks for it, and counts the launch. Every launch site
// of kernels/cuda goes through here; the kernel must begin with wait_for_previous_kernel().
// Works inside stream capture (the launch becomes a kernel node with a programmatic edge).
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                   cudaStream_t stream, Args&&... args) {
  const LaunchContext* context = current_launch_context();
  cudaLaunchAttribute programmatic = {};
  programmatic.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  programmatic.val.programmaticStreamSerializationAllowed = 1;
  const bool pdl = context && context->programmatic.load(std::memory_order_relaxed);
  launch_kernel_with(pdl ? &programmatic : nullptr, kernel, grid, block, shared_bytes, stream,
                     std::forward<Args>(args)...);
}

// A cooperative launch (cudaLaunchAttributeCooperative: the runtime refuses, rather than
// hangs, a grid whose blocks cannot all be resident at once), counted as launch_kernel counts,
// without the PDL attribute: the CUDA documentation lists the cooperative attribute as valid
// for launches and graph kernel nodes (so stream capture keeps it) and says nothing of it
// combined with programmatic stream serialization. For a kernel with a grid-wide barrier
// (cuda_persistent_mlp.cu); it still begins with wait_for_previous_kernel(), which returns at
// once without the attribute.
template <class... Params, class... Args>
void launch_cooperative_kernel(void (*kernel)(Params...), dim3 grid, dim3 block,
                               size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute cooperative = {};
  cooperative.id = cudaLaunchAttributeCooperative;
  cooperative.val.cooperative = 1;
  launch_kernel_with(&cooperative, kernel, grid, block, shared_bytes, stream,
                     std::forward<Args>(args)...);
}

// A stored element widened to f32 (bf16: exact shift; f16: exact).
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }

// Element i of a stored float vector whose dtype is only known at run time (small vectors:
// gains, biases read once per element; the branch is uniform across the warp).
__device__ __forceinline__ float load_float(const void* p, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::BF16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case DType::F16:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

// Sum over the 32 lanes of a warp; every lane gets the total.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sums N values per thread over the whole block at once (one pair of barriers for all N);
// every thread gets the N totals back in `v`. blockDim.x must be a multiple of 32 and at
// most 1024. Safe to call repeatedly: the leading barrier keeps a call's writes to the
// shared partials from racing with the previous call's reads.
template <int N>
__device__ __forceinline__ void block_sum_n(float (&v)[N]) {
  __shared__ float partial[N][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int num_warps = blockDim.x >> 5;
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = warp_sum(v[i]);
  __syncthreads();
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; ++i) partial[i][warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = warp_sum(lane < num_warps ? partial[i][lane] : 0.0f);
}

__device__ __forceinline__ float block_sum(float v) {
  float a[1] = {v};
  block_sum_n<1>(a);
  return a[0];
}

// The most threads a row-wise kernel's block has (block_sum_n's partials hold 32 warps).
// Every kernel declares the most threads it is launched with: __launch_bounds__(kMaxRowThreads,
// 1) for row_block_threads(n), __launch_bounds__(N, 1) for row_block_threads(n, N) or a fixed
// N. Without it ptxas may use more than 65536 / 1024 = 64 registers per thread, and a
// 1024-thread launch then fails ("too many resources requested"); with it ptxas stays under
// the limit, and a launch with more threads than declared fails loudly. The 1 (blocks per SM)
// matters: with the thread count alone ptxas aimed at 2 blocks per SM and squeezed
// depth_phase1_kernel<3> / <4> into 32 registers with spills (nvcc 13, sm_90a).
constexpr int kMaxRowThreads = 1024;

// Threads per block for a row-wise kernel over rows of n elements: enough warps to cover
// the row once (up to max_threads), at least one warp.
inline int row_block_threads(int64_t n, int max_threads = kMaxRowThreads) {
  int64_t threads = (n + 31) / 32 * 32;
  if (threads > max_threads) threads = max_threads;
  if (threads < 32) threads = 32;
  return static_cast<int>(threads);
}

// Grid size for a grid-stride elementwise kernel over n elements.
inline unsigned elementwise_blocks(int64_t n, int threads) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks > 65535LL * 16) blocks = 65535LL * 16;  // grid-stride loops cover the rest
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks);
}

// Calls f(std::integral_constant<int, N>{}) with N = n for n in 1..8, 8 past it: for kernels
// whose row or query count is a template parameter (registers indexed by constants).
template <class F>
void dispatch_1_to_8(int64_t n, F&& f) {
  switch (n) {
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
    default:
      return f(std::integral_constant<int, 8>{});
  }
}

// Calls f(W{}) with W the storage type of a float dtype: float, __nv_bfloat16 or __half.
template <class F>
void dispatch_float_dtype(DType dtype, const char* what, F&& f) {
  switch (dtype) {
    case DType::F32:
      f(float{});
      return;
    case DType::BF16:
      f(__nv_bfloat16{});
      return;
    case DType::F16:
      f(__half{});
      return;
    default:
      throw Error(std::string(what) + ": unsupported dtype " + std::string(dtype_name(dtype)));
  }
}

}  // namespace attnres::cuda

// After every launch: report a bad configuration at the launch site.
#define CUDA_CHECK_LAUNCH() CUDA_CHECK(cudaGetLastError())
