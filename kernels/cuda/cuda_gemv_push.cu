// The bank-push lever's GEMV (NOTES.md "GEMV levers"): cuda_gemv.cu's residual GEMV whose
// epilogue also stores the output's bf16 rounding into a depth-bank entry, so that a bf16
// bank's push of the partial the down (or o) projection has just written takes no launch of
// its own. The output's sum, bias and residual add are gemv_warp's, the rounding is
// round_to_bf16_bits (CudaBackend::copy's kernel's), so out and entry have the bits of
// launch_gemv_residual then launch_round_to_bf16.
//
// Its kernels are their own instances (kPush), with the GEMV levers' mask as gemv_lever_kernel
// takes it: the kernels of cuda_gemv.cu are compiled as they are without this file.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_gemv_rows.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

// gemv_kernel with the residual and the push; kLevers as gemv_lever_kernel's (0: none, the
// launch bounds then those of gemv_kernel).
template <class W, int R, bool kVectorized, int kLevers>
__global__ void __launch_bounds__(kGemvWarps * 32, gemv_lever_min_blocks(kLevers))
    gemv_push_kernel(const float* __restrict__ x, int64_t K, GemvSegments segments,
                     uint16_t* __restrict__ entry) {
  if constexpr ((kLevers & kGemvLeverPrefetch) != 0) prefetch_gemv_warp_row<W>(K, segments);
  if constexpr ((kLevers & kGemvLeverBulk) != 0) bulk_gemv_warp_row<W>(K, segments, 0);
  wait_for_previous_kernel();
  gemv_warp<W, R, kVectorized, /*kResidual=*/true, kLevers, /*kPush=*/true>(x, K, segments,
                                                                             /*bulk_offset=*/0,
                                                                             entry);
}

template <class W, int R>
void launch_rows(const float* x, int64_t K, const GemvSegments& one, uint16_t* entry,
                 cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(W);
  // cuda_gemv.cu's test for 16-byte vectors, for the one segment.
  const bool vec = K % kVec == 0 && K % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(one.seg[0].w) % 16 == 0;
  const unsigned grid = static_cast<unsigned>((one.seg[0].n + kGemvWarps - 1) / kGemvWarps);
  const size_t bulk_bytes = gemv_bulk_shared_bytes(0, K, sizeof(W), 1);
  const int levers = gemv_launch_levers(gemv_levers_now(), bulk_bytes);
  const size_t smem = levers == kGemvLeverBulk ? bulk_bytes : 0;
  if (vec && levers) {
    dispatch_gemv_levers<true>(levers, [&](auto l) {
      const auto kernel = gemv_push_kernel<W, R, true, decltype(l)::value>;
      allow_dynamic_shared(kernel, smem);
      launch_kernel(kernel, grid, kGemvWarps * 32, smem, stream, x, K, one, entry);
    });
  } else if (vec) {
    launch_kernel(gemv_push_kernel<W, R, true, 0>, grid, kGemvWarps * 32, 0, stream, x, K, one,
                  entry);
  } else {
    launch_kernel(gemv_push_kernel<W, R, false, 0>, grid, kGemvWarps * 32, 0, stream, x, K, one,
                  entry);
  }
}

}  // namespace

void launch_gemv_residual_push(const float* x, int64_t rows, const void* w, DType w_dtype,
                               const void* bias, DType bias_dtype, int64_t K, int64_t N,
                               const float* residual, float* out, uint16_t* entry,
                               cudaStream_t stream) {
  if (rows == 0 || N == 0) return;
  ATTNRES_CHECK(rows >= 1 && rows <= kMaxGemvRows, "gemv rows " + std::to_string(rows));
  ATTNRES_CHECK(entry != nullptr, "gemv push: no entry");
  GemvSegments one;
  one.seg[0] = {w, bias, bias_dtype, N, out, residual};
  one.count = 1;
  dispatch_float_dtype(w_dtype, "linear weight", [&](auto tag) {
    dispatch_gemv_rows(rows, [&](auto r) {
      launch_rows<decltype(tag), decltype(r)::value>(x, K, one, entry, stream);
    });
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
