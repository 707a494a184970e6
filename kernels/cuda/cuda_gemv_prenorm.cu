// The decode GEMV (cuda_gemv.cu) with the sublayer's PreNorm as its prologue
// (Backend::prenorm_linear_many / prenorm_linear_swiglu): x = the normed rows, computed by
// every block into shared memory from the partial (and, for the plain Phase-2 merge, the
// sublayer's Phase-1 row o and its m, s), instead of a separate PreNorm launch writing them to
// global memory first. One launch fewer per sublayer of a decode step.
//
// Why recompute per block: the rows are small (R <= 8 rows of d floats, 32 KB at d = 1024)
// and stay in L2, and the blocks cannot share a result without a grid-wide barrier. The cost
// is R * d (plain) or 2 R * d (merge) floats of L2 reads per block, about what the plain GEMV
// already reads of x per block through L1.
//
// Bits: the prologue (cuda_gemv_prologue.cuh) computes each normed value exactly as
// rms_norm_kernel / depth_phase2_prenorm_kernel do (cuda_prenorm_rows.cuh: the 8 warps play the
// standalone block's B / 32 warps in turn, same operands, same order), and the dot products are
// cuda_gemv_rows.cuh's row_dot: the outputs equal the two-launch path's bit for bit.
//
// Shape: as the GEMV (8 warps, one output row per warp), vector path only (K a multiple of the
// 16-byte vector, 16-byte aligned weight rows); the launcher declines the rest, and rows whose
// normed copy would not fit kMaxGemvPrenormBytes of shared memory, and the op falls back.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_gemv_prologue.cuh"
#include "kernels/cuda/cuda_gemv_rows.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

// gemv_kernel (cuda_gemv.cu) over the segments, reading x from the prologue's shared rows.
// kLevers: the mask of the GEMV levers compiled in (cuda_gemv_rows.cuh); 0 is the kernel
// without a lever, whose declaration the others do not change.
template <class W, int R, int kLevers>
__device__ __forceinline__ void gemv_prenorm_block(const GemvPrenorm& prenorm, int prenorm_threads,
                                                   int64_t K, const GemvSegments& segments) {
  extern __shared__ __align__(16) float x[];  // [R, K], then the bulk lever's weight rows
  const size_t bulk_offset = gemv_bulk_offset(static_cast<size_t>(R * K) * sizeof(float));
  if constexpr ((kLevers & kGemvLeverPrefetch) != 0) prefetch_gemv_warp_row<W>(K, segments);
  if constexpr ((kLevers & kGemvLeverBulk) != 0) bulk_gemv_warp_row<W>(K, segments, bulk_offset);
  wait_for_previous_kernel();
  prenorm_rows<R>(prenorm, K, prenorm_threads, x);
  // The prologue's segments carry no residual (GemvPrenorm's callers; it cost this kernel
  // spills at R = 3 with f32 weights).
  gemv_warp<W, R, true, /*kResidual=*/false, kLevers>(x, K, segments, bulk_offset);
}

template <class W, int R>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_prenorm_kernel(GemvPrenorm prenorm, int prenorm_threads, int64_t K,
                        GemvSegments segments) {
  gemv_prenorm_block<W, R, 0>(prenorm, prenorm_threads, K, segments);
}

template <class W, int R, int kLevers>
__global__ void __launch_bounds__(kGemvWarps * 32, gemv_lever_min_blocks(kLevers))
    gemv_prenorm_lever_kernel(GemvPrenorm prenorm, int prenorm_threads, int64_t K,
                              GemvSegments segments) {
  gemv_prenorm_block<W, R, kLevers>(prenorm, prenorm_threads, K, segments);
}

// gemv_swiglu_kernel (cuda_gemv.cu), reading x from the prologue's shared rows.
template <class W, int R, int kLevers>
__device__ __forceinline__ void gemv_prenorm_swiglu_block(const GemvPrenorm& prenorm,
                                                          int prenorm_threads, int64_t K,
                                                          const GemvSegment& gate,
                                                          const GemvSegment& up, float* out) {
  extern __shared__ __align__(16) float x[];  // [R, K], then the bulk lever's weight rows
  const size_t bulk_offset = gemv_bulk_offset(static_cast<size_t>(R * K) * sizeof(float));
  if constexpr ((kLevers & kGemvLeverPrefetch) != 0) prefetch_swiglu_warp_rows<W>(K, gate, up);
  if constexpr ((kLevers & kGemvLeverBulk) != 0)
    bulk_swiglu_warp_rows<W>(K, gate, up, bulk_offset);
  wait_for_previous_kernel();
  prenorm_rows<R>(prenorm, K, prenorm_threads, x);
  gemv_swiglu_warp<W, R, true, kLevers>(x, K, gate, up, out, bulk_offset);
}

template <class W, int R>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_prenorm_swiglu_kernel(GemvPrenorm prenorm, int prenorm_threads, int64_t K,
                               GemvSegment gate, GemvSegment up, float* __restrict__ out) {
  gemv_prenorm_swiglu_block<W, R, 0>(prenorm, prenorm_threads, K, gate, up, out);
}

template <class W, int R, int kLevers>
__global__ void __launch_bounds__(kGemvWarps * 32, gemv_lever_min_blocks(kLevers))
    gemv_prenorm_swiglu_lever_kernel(GemvPrenorm prenorm, int prenorm_threads, int64_t K,
                                     GemvSegment gate, GemvSegment up, float* __restrict__ out) {
  gemv_prenorm_swiglu_block<W, R, kLevers>(prenorm, prenorm_threads, K, gate, up, out);
}

template <class W, int R>
void launch_rows(const GemvPrenorm& prenorm, int64_t K, const GemvSegments& segments,
                 float* swiglu_out, cudaStream_t stream) {
  const int threads = kGemvWarps * 32;
  const size_t x_bytes = static_cast<size_t>(R * K) * sizeof(float);
  // The block size of the standalone PreNorm kernels, whose reduction order the prologue keeps.
  const int prenorm_threads = row_block_threads(K);
  const size_t bulk_bytes = gemv_bulk_shared_bytes(x_bytes, K, sizeof(W), swiglu_out ? 2 : 1);
  const int levers = gemv_launch_levers(gemv_levers_now(), bulk_bytes);
  const size_t smem = levers == kGemvLeverBulk ? bulk_bytes : x_bytes;
  if (swiglu_out) {  // segments: gate, then up
    const unsigned grid = static_cast<unsigned>((segments.seg[0].n + kGemvWarps - 1) / kGemvWarps);
    if (levers) {
      dispatch_gemv_levers<true>(levers, [&](auto l) {
        const auto kernel = gemv_prenorm_swiglu_lever_kernel<W, R, decltype(l)::value>;
        allow_dynamic_shared(kernel, smem);
        launch_kernel(kernel, grid, dim3(threads), smem, stream, prenorm, prenorm_threads, K,
                      segments.seg[0], segments.seg[1], swiglu_out);
      });
    } else {
      launch_kernel(gemv_prenorm_swiglu_kernel<W, R>, grid, dim3(threads), smem, stream, prenorm,
                    prenorm_threads, K, segments.seg[0], segments.seg[1], swiglu_out);
    }
    return;
  }
  int64_t total = 0;
  for (int s = 0; s < segments.count; ++s) total += segments.seg[s].n;
  const unsigned grid = static_cast<unsigned>((total + kGemvWarps - 1) / kGemvWarps);
  if (levers) {
    dispatch_gemv_levers<true>(levers, [&](auto l) {
      const auto kernel = gemv_prenorm_lever_kernel<W, R, decltype(l)::value>;
      allow_dynamic_shared(kernel, smem);
      launch_kernel(kernel, grid, dim3(threads), smem, stream, prenorm, prenorm_threads, K,
                    segments);
    });
  } else {
    launch_kernel(gemv_prenorm_kernel<W, R>, grid, dim3(threads), smem, stream, prenorm,
                  prenorm_threads, K, segments);
  }
}

template <class W>
void launch_typed(const GemvPrenorm& prenorm, int64_t rows, int64_t K, const GemvSegments& segments,
                  float* swiglu_out, cudaStream_t stream) {
  dispatch_gemv_rows(rows, [&](auto r) {
    launch_rows<W, decltype(r)::value>(prenorm, K, segments, swiglu_out, stream);
  });
}

// Launches unless the shapes are ones the kernels do not take (see the header comment).
bool try_launch(const GemvPrenorm& prenorm, int64_t rows, int64_t K, DType w_dtype,
                const GemvSegments& segments, float* swiglu_out, cudaStream_t stream) {
  ATTNRES_CHECK(segments.count >= 1 && segments.count <= kMaxGemvSegments,
                "gemv segments " + std::to_string(segments.count));
  for (int i = 0; i < segments.count; ++i)
    ATTNRES_CHECK(!segments.seg[i].residual, "gemv prenorm: a segment with a residual");
  if (!gemv_prenorm_takes(rows, K)) return false;
  const int64_t vec = w_dtype == DType::F32 ? 4 : 8;  // weights per 16-byte vector
  if (K % vec != 0) return false;
  for (int s = 0; s < segments.count; ++s) {
    if (reinterpret_cast<uintptr_t>(segments.seg[s].w) % 16 != 0) return false;
  }
  dispatch_float_dtype(w_dtype, "linear weight", [&](auto tag) {
    launch_typed<decltype(tag)>(prenorm, rows, K, segments, swiglu_out, stream);
  });
  CUDA_CHECK_LAUNCH();
  return true;
}

}  // namespace

bool gemv_prenorm_takes(int64_t rows, int64_t K) {
  return rows >= 1 && rows <= kMaxGemvRows && K > 0 && K % 4 == 0 &&
         rows * K * static_cast<int64_t>(sizeof(float)) <= kMaxGemvPrenormBytes;
}

bool launch_gemv_prenorm_many(const GemvPrenorm& prenorm, int64_t rows, int64_t K, DType w_dtype,
                              const GemvSegments& segments, cudaStream_t stream) {
  return try_launch(prenorm, rows, K, w_dtype, segments, nullptr, stream);
}

bool launch_gemv_prenorm_swiglu(const GemvPrenorm& prenorm, int64_t rows, int64_t K, DType w_dtype,
                                const GemvSegment& gate, const GemvSegment& up, float* out,
                                cudaStream_t stream) {
  GemvSegments both;
  both.seg[0] = gate;
  both.seg[1] = up;
  both.count = 2;
  return try_launch(prenorm, rows, K, w_dtype, both, out, stream);
}

}  // namespace attnres::cuda
