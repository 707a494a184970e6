// Decode-sized linear (R <= 8 input rows): out[r, o] = sum_k x[r, k] w[o, k] (+ bias[o]),
// x f32 [R, K], w [N, K] F32 / BF16 / F16 read as stored, out f32 [R, N].
//
// Decode is memory-bound: every weight byte is read once per step and x (R * K * 4 bytes)
// stays in L1/L2. cuBLAS would need x converted to the weight dtype first (one more launch,
// and bf16-rounded activations); this kernel keeps x in f32, so it matches the CPU to f32
// rounding, and fuses the bias.
//
// Shape: one warp per output row o, 8 warps (8 rows) per block. Lane j reads the row in
// 16-byte vectors (8 bf16 / f16 or 4 f32 values) at k = 16B * (j + 32 i): a warp reads
// 512 contiguous bytes per iteration (coalesced), unrolled so several loads are in flight.
// Each weight vector is widened in registers and FMA'd against the R rows of x (f32, read
// through L1 as float4). Then a warp_sum per row and lane 0 writes the R outputs.
// Rows whose K or pointers do not allow 16-byte vectors use the scalar loop (lane-strided).
//
// Fusions for decode's launch count: several weights of one input in one launch (q, k, v:
// gemv_kernel over segments), and the MLP's gate and up rows read by one warp with SwiGLU as
// the epilogue (gemv_swiglu_kernel): per layer 6 launches become 2. And the residual add as
// gemv_kernel's epilogue (launch_gemv_residual: o_proj and down_proj into the partial sum).
//
// The vector path's kernels also come with the GEMV levers compiled in (the `*_lever_kernel`s,
// cuda_gemv_levers.h), launched when the backend has them on; the same outputs, bit for bit.
// Under the bulk lever (cuda_gemv_bulk.cuh) a block's dynamic shared memory holds its warps'
// weight rows: 8 x K weights (16 x K for SwiGLU).
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_gemv_rows.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

// One launch over the output rows of every segment in turn (a layer's q, k and v: one input,
// several weights): warp o finds its segment, so a block may straddle two.
template <class W, int R, bool kVectorized>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_kernel(const float* __restrict__ x, int64_t K, GemvSegments segments) {
  wait_for_previous_kernel();
  gemv_warp<W, R, kVectorized>(x, K, segments);
}

// gemv_kernel's vector path with the GEMV levers of the mask kLevers (cuda_gemv_rows.cuh).
template <class W, int R, int kLevers>
__global__ void __launch_bounds__(kGemvWarps * 32, gemv_lever_min_blocks(kLevers))
    gemv_lever_kernel(const float* __restrict__ x, int64_t K, GemvSegments segments) {
  if constexpr ((kLevers & kGemvLeverPrefetch) != 0) prefetch_gemv_warp_row<W>(K, segments);
  if constexpr ((kLevers & kGemvLeverBulk) != 0) bulk_gemv_warp_row<W>(K, segments, 0);
  wait_for_previous_kernel();
  gemv_warp<W, R, true, /*kResidual=*/true, kLevers>(x, K, segments);
}

// out[r, o] = silu(x[r] . wg[o] + bg[o]) * (x[r] . wu[o] + bu[o]): warp o reads both rows, so
// gate and up never leave registers (the eager path's two outputs and swiglu launch).
template <class W, int R, bool kVectorized>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_swiglu_kernel(const float* __restrict__ x, int64_t K, GemvSegment gate, GemvSegment up,
                       float* __restrict__ out) {
  wait_for_previous_kernel();
  gemv_swiglu_warp<W, R, kVectorized>(x, K, gate, up, out);
}

// gemv_swiglu_kernel's vector path with the GEMV levers of the mask kLevers.
template <class W, int R, int kLevers>
__global__ void __launch_bounds__(kGemvWarps * 32, gemv_lever_min_blocks(kLevers))
    gemv_swiglu_lever_kernel(const float* __restrict__ x, int64_t K, GemvSegment gate,
                             GemvSegment up, float* __restrict__ out) {
  if constexpr ((kLevers & kGemvLeverPrefetch) != 0) prefetch_swiglu_warp_rows<W>(K, gate, up);
  if constexpr ((kLevers & kGemvLeverBulk) != 0) bulk_swiglu_warp_rows<W>(K, gate, up, 0);
  wait_for_previous_kernel();
  gemv_swiglu_warp<W, R, true, kLevers>(x, K, gate, up, out);
}

// Whether every weight row and x allow 16-byte vectors.
template <class W>
bool vectorizable(const float* x, int64_t K, const GemvSegment* segs, int count) {
  constexpr int kVec = 16 / sizeof(W);
  bool ok = K % kVec == 0 && K % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  for (int s = 0; s < count; ++s) ok = ok && reinterpret_cast<uintptr_t>(segs[s].w) % 16 == 0;
  return ok;
}

unsigned grid_for(int64_t rows) {
  return static_cast<unsigned>((rows + kGemvWarps - 1) / kGemvWarps);
}

template <class W, int R>
void launch_rows(const float* x, int64_t K, const GemvSegments& segments, float* swiglu_out,
                 cudaStream_t stream) {
  const int rows_per_warp = swiglu_out ? 2 : 1;
  const size_t bulk_bytes = gemv_bulk_shared_bytes(0, K, sizeof(W), rows_per_warp);
  const int levers = gemv_launch_levers(gemv_levers_now(), bulk_bytes);
  const size_t smem = levers == kGemvLeverBulk ? bulk_bytes : 0;
  if (swiglu_out) {  // segments: gate then up
    const bool vec = vectorizable<W>(x, K, segments.seg, 2);
    const unsigned grid = grid_for(segments.seg[0].n);
    if (vec && levers) {
      dispatch_gemv_levers<true>(levers, [&](auto l) {
        const auto kernel = gemv_swiglu_lever_kernel<W, R, decltype(l)::value>;
        allow_dynamic_shared(kernel, smem);
        launch_kernel(kernel, grid, kGemvWarps * 32, smem, stream, x, K, segments.seg[0],
                      segments.seg[1], swiglu_out);
      });
    } else if (vec) {
      launch_kernel(gemv_swiglu_kernel<W, R, true>, grid, kGemvWarps * 32, 0, stream, x, K,
                    segments.seg[0], segments.seg[1], swiglu_out);
    } else {
      launch_kernel(gemv_swiglu_kernel<W, R, false>, grid, kGemvWarps * 32, 0, stream, x, K,
                    segments.seg[0], segments.seg[1], swiglu_out);
    }
    return;
  }
  int64_t total = 0;
  for (int s = 0; s < segments.count; ++s) total += segments.seg[s].n;
  const bool vec = vectorizable<W>(x, K, segments.seg, segments.count);
  if (vec && levers) {
    dispatch_gemv_levers<true>(levers, [&](auto l) {
      const auto kernel = gemv_lever_kernel<W, R, decltype(l)::value>;
      allow_dynamic_shared(kernel, smem);
      launch_kernel(kernel, grid_for(total), kGemvWarps * 32, smem, stream, x, K, segments);
    });
  } else if (vec) {
    launch_kernel(gemv_kernel<W, R, true>, grid_for(total), kGemvWarps * 32, 0, stream, x, K,
                  segments);
  } else {
    launch_kernel(gemv_kernel<W, R, false>, grid_for(total), kGemvWarps * 32, 0, stream, x, K,
                  segments);
  }
}

template <class W>
void launch_typed(const float* x, int64_t rows, int64_t K, const GemvSegments& segments,
                  float* swiglu_out, cudaStream_t stream) {
  dispatch_gemv_rows(rows, [&](auto r) {
    launch_rows<W, decltype(r)::value>(x, K, segments, swiglu_out, stream);
  });
}

void launch(const float* x, int64_t rows, int64_t K, DType w_dtype, const GemvSegments& segments,
            float* swiglu_out, cudaStream_t stream) {
  ATTNRES_CHECK(rows >= 1 && rows <= kMaxGemvRows, "gemv rows " + std::to_string(rows));
  ATTNRES_CHECK(segments.count >= 1 && segments.count <= kMaxGemvSegments,
                "gemv segments " + std::to_string(segments.count));
  dispatch_float_dtype(w_dtype, "linear weight", [&](auto tag) {
    launch_typed<decltype(tag)>(x, rows, K, segments, swiglu_out, stream);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_gemv(const float* x, int64_t rows, const void* w, DType w_dtype, const void* bias,
                 DType bias_dtype, int64_t K, int64_t N, float* out, cudaStream_t stream) {
  if (rows == 0 || N == 0) return;
  GemvSegments one;
  one.seg[0] = {w, bias, bias_dtype, N, out};
  one.count = 1;
  launch(x, rows, K, w_dtype, one, nullptr, stream);
}

void launch_gemv_residual(const float* x, int64_t rows, const void* w, DType w_dtype,
                          const void* bias, DType bias_dtype, int64_t K, int64_t N,
                          const float* residual, float* out, cudaStream_t stream) {
  if (rows == 0 || N == 0) return;
  GemvSegments one;
  one.seg[0] = {w, bias, bias_dtype, N, out, residual};
  one.count = 1;
  launch(x, rows, K, w_dtype, one, nullptr, stream);
}

void launch_gemv_many(const float* x, int64_t rows, int64_t K, DType w_dtype,
                      const GemvSegments& segments, cudaStream_t stream) {
  if (rows == 0) return;
  launch(x, rows, K, w_dtype, segments, nullptr, stream);
}

void launch_gemv_swiglu(const float* x, int64_t rows, int64_t K, DType w_dtype,
                        const GemvSegment& gate, const GemvSegment& up, float* out,
                        cudaStream_t stream) {
  if (rows == 0 || gate.n == 0) return;
  GemvSegments both;
  both.seg[0] = gate;
  both.seg[1] = up;
  both.count = 2;
  launch(x, rows, K, w_dtype, both, out, stream);
}

}  // namespace attnres::cuda
