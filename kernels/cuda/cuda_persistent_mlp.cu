// The MLP sublayer of a decode step as one persistent launch (Backend::prenorm_mlp_residual
// under CudaBackend::set_persistent_mlp, ATTNRES_CUDA_PERSISTENT_MLP=1), in place of
// gemv_prenorm_swiglu_kernel then gemv_kernel with the residual epilogue:
//   (a) every block computes the PreNorm rows into shared memory (cuda_gemv_prologue.cuh);
//   (b) its warps stride over the gate / up rows (global warp w takes rows w, w + warps, ...),
//       writing the SwiGLU product act to global memory;
//   (c) each warp has, since the start, been copying the down rows it will multiply into shared
//       memory (cp.async, 16 bytes a lane: weights do not depend on act), as many as fit;
//   (d) a grid-wide barrier: act complete;
//   (e) act into shared memory (through L2), then the down rows with bias and residual.
// So the SMs stream the down weights while the prologue and the gate / up rows run, and the
// down GEMV's launch and its wait for the SwiGLU kernel's tail go.
//
// Bits: the prologue is the prenorm kernels' (same function); a gate / up row is
// gemv_swiglu_warp's non-lever code with the row as a parameter; a down row is gemv_warp's:
// row_dot for a row read from global memory, fma_weight_vector (row_dot's loop body, the deep
// lever's) over the same lane-strided vectors for a staged row, then warp_sum, bias, residual
// in that order. The outputs equal the two-launch path's bit for bit.
//
// Shared memory: x [R, max(d, I)] f32 (the normed rows, then act) and the staged rows, 8 warps
// x S rows x I weights: at the 0.6B shape (d 1024, I 3072, bf16) a block per SM on 132 SMs
// gives every warp at most one down row (6 KB), 48 KB a block, beside 12-96 KB of act.
//
// The barrier: two words per backend (arrivals, generation), zero when the backend is built.
// Thread 0 of each block reads the generation, then adds 1 to the arrivals; the last to arrive
// sets the arrivals back to 0 and bumps the generation, which the others wait for. So the
// arrivals are 0 again after every launch, and graph replays need no reset. It needs every
// block resident at once: the grid is at most SMs x the blocks per SM that fit
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor) and the launch is cooperative, which the
// runtime refuses rather than hang where they do not fit.
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_gemv_prologue.cuh"
#include "kernels/cuda/cuda_gemv_rows.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

constexpr int kThreads = kGemvWarps * 32;

// 16 bytes global -> shared, asynchronously (cp.async.cg: through L2 only).
__device__ __forceinline__ void copy_async_16(void* shared, const void* global) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(global) : "memory");
}

// Every cp.async of this thread complete and visible to it.
__device__ __forceinline__ void copy_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}

// Every block of the grid has reached it, and what any block wrote before it is visible to
// every block after it (the fences around thread 0's atomics, cumulative through the block
// barriers). state: [0] arrivals, 0 before and after; [1] generation, any value.
__device__ __forceinline__ void grid_barrier(unsigned* state) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* generation = state + 1;
    // Read before arriving: the last block bumps it only once every block has arrived.
    const unsigned seen = *generation;
    __threadfence();
    if (atomicAdd(state, 1u) == gridDim.x - 1) {
      atomicExch(state, 0u);
      __threadfence();
      atomicAdd(state + 1, 1u);
    } else {
      while (*generation == seen) __nanosleep(32);
    }
    __threadfence();
  }
  __syncthreads();
}

// gemv_swiglu_warp (cuda_gemv_rows.cuh), vector path without a lever, for output row o:
// act[r, o] = silu(x[r] . wg[o] + bg[o]) * (x[r] . wu[o] + bu[o]).
template <class W, int R>
__device__ __forceinline__ void swiglu_row(const float* __restrict__ x, int64_t K,
                                           const GemvSegment& gate, const GemvSegment& up,
                                           int64_t o, int lane, float* __restrict__ out) {
  float acc_g[R], acc_u[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc_g[r] = acc_u[r] = 0.0f;
  row_dot<W, R, true>(x, static_cast<const W*>(gate.w) + o * K, K, lane, acc_g);
  row_dot<W, R, true>(x, static_cast<const W*>(up.w) + o * K, K, lane, acc_u);
  const float bg = gate.bias ? load_float(gate.bias, gate.bias_dtype, o) : 0.0f;
  const float bu = up.bias ? load_float(up.bias, up.bias_dtype, o) : 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float g = warp_sum(acc_g[r]) + bg, u = warp_sum(acc_u[r]) + bu;
    if (lane == 0) out[r * gate.n + o] = g / (1.0f + expf(-g)) * u;  // as swiglu_kernel
  }
}

// row_dot's vector path over a row staged in shared memory: the lane reads the vectors it
// copied (k = lane * kVec + 32 kVec i) and consumes each as row_dot does.
template <class W, int R>
__device__ __forceinline__ void staged_row_dot(const float* __restrict__ x, const W* staged,
                                               int64_t K, int lane, float (&acc)[R]) {
  constexpr int kVec = WeightVector<W>::kVec;
#pragma unroll 4
  for (int64_t k = static_cast<int64_t>(lane) * kVec; k < K; k += 32 * kVec) {
    const uint4 raw = *reinterpret_cast<const uint4*>(staged + k);
    fma_weight_vector<W, R>(raw, x, K, k, acc);
  }
}

template <class W, int R>
__global__ void __launch_bounds__(kThreads, 1)
    persistent_mlp_kernel(GemvPrenorm prenorm, int prenorm_threads, int64_t D, int64_t I,
                          GemvSegment gate, GemvSegment up, float* act, GemvSegment down,
                          int staged_rows, unsigned* barrier) {
  extern __shared__ __align__(16) float shared[];
  constexpr int kVec = WeightVector<W>::kVec;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kGemvWarps;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  float* x = shared;  // [R, max(D, I)]
  W* staged = reinterpret_cast<W*>(shared + R * (D > I ? D : I)) +
              static_cast<int64_t>(warp) * staged_rows * I;
  wait_for_previous_kernel();

  // (c) The down rows this warp multiplies after the barrier, as many as were given room.
  for (int j = 0; j < staged_rows; ++j) {
    const int64_t o = first + j * warps;
    if (o >= D) break;
    const W* wr = static_cast<const W*>(down.w) + o * I;
    for (int64_t k = static_cast<int64_t>(lane) * kVec; k < I; k += 32 * kVec)
      copy_async_16(staged + j * I + k, wr + k);
  }

  // (a) The normed rows; (b) the gate / up rows.
  prenorm_rows<R>(prenorm, D, prenorm_threads, x);
  for (int64_t o = first; o < I; o += warps) swiglu_row<W, R>(x, D, gate, up, o, lane, act);

  // (d) act complete in global memory; this thread's staged vectors in shared memory.
  copy_async_wait_all();
  grid_barrier(barrier);

  // (e) act [R, I] into x, read through L2 (written by other SMs in this launch), then down.
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * 4; i < R * I; i += kThreads * 4)
    *reinterpret_cast<float4*>(x + i) = __ldcg(reinterpret_cast<const float4*>(act + i));
  __syncthreads();
  int j = 0;
  for (int64_t o = first; o < D; o += warps, ++j) {
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] = 0.0f;
    if (j < staged_rows) {
      staged_row_dot<W, R>(x, staged + j * I, I, lane, acc);
    } else {
      row_dot<W, R, true>(x, static_cast<const W*>(down.w) + o * I, I, lane, acc);
    }
    // gemv_warp's epilogue: bias, then the residual (read by the lane that writes out).
    const float b = down.bias ? load_float(down.bias, down.bias_dtype, o) : 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float total = warp_sum(acc[r]);
      if (lane == 0) {
        float y = total + b;
        if (down.residual) y += down.residual[r * down.n + o];
        down.out[r * down.n + o] = y;
      }
    }
  }
}

template <class W, int R>
bool plan_rows(const PersistentMlpArgs& a, PersistentMlpPlan& plan) {
  int device = 0, sms = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attrs{};
  CUDA_CHECK(cudaFuncGetAttributes(&attrs, persistent_mlp_kernel<W, R>));
  if (static_cast<size_t>(optin) <= attrs.sharedSizeBytes) return false;
  const size_t dynamic_max = static_cast<size_t>(optin) - attrs.sharedSizeBytes;
  const int64_t D = a.d, I = a.intermediate;
  const size_t x_bytes = static_cast<size_t>(R * std::max(D, I)) * sizeof(float);
  if (x_bytes > dynamic_max) return false;
  // The kernel may take every byte of shared memory a block can opt into (on this device).
  CUDA_CHECK(cudaFuncSetAttribute(persistent_mlp_kernel<W, R>,
                                  cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(dynamic_max)));
  const size_t row_bytes = static_cast<size_t>(I) * sizeof(W);
  const size_t warp_rows_bytes = row_bytes * kGemvWarps;  // one staged row for every warp
  const auto rows_per_warp = [&](int64_t blocks) {
    const int64_t warps = blocks * kGemvWarps;
    return static_cast<int>((D + warps - 1) / warps);
  };
  const int64_t useful_blocks = (std::max(D, I) + kGemvWarps - 1) / kGemvWarps;
  // Staging sized for a block per SM first; more blocks per SM where they still fit.
  int staged = static_cast<int>(
      std::min<int64_t>(rows_per_warp(std::min<int64_t>(sms, useful_blocks)),
                        static_cast<int64_t>((dynamic_max - x_bytes) / warp_rows_bytes)));
  if (a.max_staged_rows_per_warp >= 0) staged = std::min(staged, a.max_staged_rows_per_warp);
  int per_sm = 0;
  CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
      &per_sm, persistent_mlp_kernel<W, R>, kThreads, x_bytes + staged * warp_rows_bytes));
  if (per_sm < 1) return false;
  const int64_t grid = std::min<int64_t>(static_cast<int64_t>(sms) * per_sm, useful_blocks);
  staged = std::min(staged, rows_per_warp(grid));  // less shared memory: still resident
  plan.grid = static_cast<int>(grid);
  plan.blocks_per_sm = per_sm;
  plan.staged_rows_per_warp = staged;
  plan.shared_bytes = x_bytes + staged * warp_rows_bytes;
  return true;
}

template <class W>
bool plan_typed(const PersistentMlpArgs& a, PersistentMlpPlan& plan) {
  bool ok = false;
  dispatch_gemv_rows(a.rows, [&](auto r) { ok = plan_rows<W, decltype(r)::value>(a, plan); });
  return ok;
}

bool shapes_taken(const PersistentMlpArgs& a) {
  const int64_t vec = a.w_dtype == DType::F32 ? 4 : 8;  // weights per 16-byte vector
  if (a.rows < 1 || a.rows > kMaxGemvRows || !gemv_prenorm_takes(a.rows, a.d)) return false;
  if (a.intermediate <= 0 || a.d % vec != 0 || a.intermediate % vec != 0) return false;
  if (a.gate.n != a.intermediate || a.up.n != a.intermediate || a.down.n != a.d) return false;
  if (!a.barrier || !a.act || !a.down.out) return false;
  for (const void* p : {a.gate.w, a.up.w, a.down.w, static_cast<const void*>(a.act)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return a.w_dtype == DType::F32 || a.w_dtype == DType::BF16 || a.w_dtype == DType::F16;
}

template <class W, int R>
void launch_rows(const PersistentMlpArgs& a, const PersistentMlpPlan& plan, cudaStream_t stream) {
  // The block size of the standalone PreNorm kernels, whose reduction order the prologue keeps.
  const int prenorm_threads = row_block_threads(a.d);
  launch_cooperative_kernel(persistent_mlp_kernel<W, R>, dim3(plan.grid), dim3(kThreads),
                            plan.shared_bytes, stream, a.prenorm, prenorm_threads, a.d,
                            a.intermediate, a.gate, a.up, a.act, a.down,
                            plan.staged_rows_per_warp, a.barrier);
}

}  // namespace

bool persistent_mlp_takes(const PersistentMlpArgs& args, PersistentMlpPlan* plan) {
  if (!shapes_taken(args)) return false;
  // Planned once per device and shape: the attribute, occupancy and shared-memory calls stay
  // out of the steps after the first, and so out of a stream capture that follows a warm-up.
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int>;
  static std::mutex mutex;
  static std::map<Key, std::pair<bool, PersistentMlpPlan>> plans;
  int device = 0;
  CUDA_CHECK(cudaGetDevice(&device));
  const Key key{device, static_cast<int>(args.w_dtype), args.rows, args.d, args.intermediate,
                args.max_staged_rows_per_warp};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans.find(key);
  if (it == plans.end()) {
    PersistentMlpPlan p;
    bool ok = false;
    dispatch_float_dtype(args.w_dtype, "linear weight",
                         [&](auto tag) { ok = plan_typed<decltype(tag)>(args, p); });
    it = plans.emplace(key, std::make_pair(ok, p)).first;
  }
  if (it->second.first && plan) *plan = it->second.second;
  return it->second.first;
}

bool launch_persistent_mlp(const PersistentMlpArgs& args, cudaStream_t stream) {
  PersistentMlpPlan plan;
  if (!persistent_mlp_takes(args, &plan)) return false;
  dispatch_float_dtype(args.w_dtype, "linear weight", [&](auto tag) {
    using W = decltype(tag);
    dispatch_gemv_rows(args.rows,
                       [&](auto r) { launch_rows<W, decltype(r)::value>(args, plan, stream); });
  });
  CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace attnres::cuda
