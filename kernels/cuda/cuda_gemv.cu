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
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

constexpr int kGemvWarps = 8;

// Widens the kVec weights packed in a 16-byte vector.
template <class W>
struct WeightVector {
  static constexpr int kVec = 16 / sizeof(W);
  float v[kVec];
  __device__ __forceinline__ void load(const W* p) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const W* e = reinterpret_cast<const W*>(&raw);
#pragma unroll
    for (int i = 0; i < kVec; ++i) v[i] = to_f32(e[i]);
  }
};

template <class W, int R, bool kVectorized>
__global__ void __launch_bounds__(kGemvWarps * 32)
    gemv_kernel(const float* __restrict__ x, const W* __restrict__ w, const void* bias,
                DType bias_dtype, int64_t K, int64_t N, float* __restrict__ out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  if (o >= N) return;  // whole warp; no block barriers below
  const W* wr = w + o * K;
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;

  if constexpr (kVectorized) {
    constexpr int kVec = WeightVector<W>::kVec;
#pragma unroll 4
    for (int64_t k = static_cast<int64_t>(lane) * kVec; k < K; k += 32 * kVec) {
      WeightVector<W> wv;
      wv.load(wr + k);
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

  const float b = bias ? load_float(bias, bias_dtype, o) : 0.0f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float total = warp_sum(acc[r]);
    if (lane == 0) out[r * N + o] = total + b;
  }
}

template <class W, int R>
void launch_gemv_rows(const float* x, const W* w, const void* bias, DType bias_dtype, int64_t K,
                      int64_t N, float* out, cudaStream_t stream) {
  constexpr int kVec = 16 / sizeof(W);
  const bool vectorized = K % kVec == 0 && K % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                          reinterpret_cast<uintptr_t>(w) % 16 == 0;
  const unsigned grid = static_cast<unsigned>((N + kGemvWarps - 1) / kGemvWarps);
  if (vectorized) {
    gemv_kernel<W, R, true>
        <<<grid, kGemvWarps * 32, 0, stream>>>(x, w, bias, bias_dtype, K, N, out);
  } else {
    gemv_kernel<W, R, false>
        <<<grid, kGemvWarps * 32, 0, stream>>>(x, w, bias, bias_dtype, K, N, out);
  }
}

template <class W>
void launch_gemv_typed(const float* x, int64_t rows, const W* w, const void* bias, DType bias_dtype,
                       int64_t K, int64_t N, float* out, cudaStream_t stream) {
  switch (rows) {
    case 1:
      return launch_gemv_rows<W, 1>(x, w, bias, bias_dtype, K, N, out, stream);
    case 2:
      return launch_gemv_rows<W, 2>(x, w, bias, bias_dtype, K, N, out, stream);
    case 3:
      return launch_gemv_rows<W, 3>(x, w, bias, bias_dtype, K, N, out, stream);
    case 4:
      return launch_gemv_rows<W, 4>(x, w, bias, bias_dtype, K, N, out, stream);
    case 5:
      return launch_gemv_rows<W, 5>(x, w, bias, bias_dtype, K, N, out, stream);
    case 6:
      return launch_gemv_rows<W, 6>(x, w, bias, bias_dtype, K, N, out, stream);
    case 7:
      return launch_gemv_rows<W, 7>(x, w, bias, bias_dtype, K, N, out, stream);
    default:
      return launch_gemv_rows<W, 8>(x, w, bias, bias_dtype, K, N, out, stream);
  }
}

}  // namespace

void launch_gemv(const float* x, int64_t rows, const void* w, DType w_dtype, const void* bias,
                 DType bias_dtype, int64_t K, int64_t N, float* out, cudaStream_t stream) {
  if (rows == 0 || N == 0) return;
  ATTNRES_CHECK(rows <= kMaxGemvRows, "gemv rows " + std::to_string(rows));
  dispatch_float_dtype(w_dtype, "linear weight", [&](auto tag) {
    using W = decltype(tag);
    launch_gemv_typed<W>(x, rows, static_cast<const W*>(w), bias, bias_dtype, K, N, out, stream);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
