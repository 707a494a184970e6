// Streaming kernels: embedding (gather + widen), swiglu, add_inplace, gather_rows, the f32 ->
// bf16 / f16 conversion of activations before a cuBLAS GEMM, the f32 -> bf16 rounding of an
// entry entering a bf16 depth bank (bit for bit as the CPU's), and the bias epilogue.
//
// Layout: everything is contiguous row-major. The row-wise kernels (embedding, gather_rows,
// add_bias) use one block per row and a stride loop over the columns, so consecutive threads
// touch consecutive addresses (coalesced). The flat kernels (swiglu, add, convert) are grid-
// stride loops over all elements. These are memory-bound and tiny next to the GEMMs; they
// are written for clarity, not vector width (16-byte loads are a later optimisation).
#include "kernels/cuda/cuda_activation.cuh"
#include "kernels/cuda/cuda_bf16_round.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

constexpr int kThreads = 256;

template <class W>
__global__ void __launch_bounds__(kThreads, 1)
    embedding_kernel(const W* __restrict__ table, const int32_t* __restrict__ ids, int64_t d,
                     float* __restrict__ out) {
  wait_for_previous_kernel();
  const int64_t t = blockIdx.x;
  const W* row = table + static_cast<int64_t>(ids[t]) * d;
  float* dst = out + t * d;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dst[i] = to_f32(row[i]);
}

// O: float, or uint16_t (bf16 bits: down_proj's GEMM input, cuda_activation.cuh).
template <class O>
__global__ void __launch_bounds__(kThreads, 1)
    swiglu_kernel(const float* __restrict__ gate, const float* __restrict__ up, O* __restrict__ out,
                  int64_t n) {
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    store_activation(out + i, g / (1.0f + expf(-g)) * up[i]);  // silu(g) * up, as the CPU
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    add_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

// One block per output row; copies 4-byte words when the row size allows, else bytes.
template <class Word>
__global__ void __launch_bounds__(kThreads, 1)
    gather_rows_kernel(const Word* __restrict__ x, const int32_t* __restrict__ rows,
                       int64_t row_words, Word* __restrict__ out) {
  wait_for_previous_kernel();
  const int64_t i = blockIdx.x;
  const Word* src = x + static_cast<int64_t>(rows[i]) * row_words;
  Word* dst = out + i * row_words;
  for (int64_t w = threadIdx.x; w < row_words; w += blockDim.x) dst[w] = src[w];
}

template <class W>
__device__ __forceinline__ W from_f32(float v);
// round_to_bf16_bits: the rounding of the kernels that write bf16 activations themselves
// (cuda_activation.cuh), so a GEMM input has the same bits either way. It equals
// __float2bfloat16_rn on every value but NaN (whose payload it keeps).
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __ushort_as_bfloat16(round_to_bf16_bits(v));
}
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) {
  return __float2half_rn(v);
}

template <class W>
__global__ void __launch_bounds__(kThreads, 1)
    convert_kernel(const float* __restrict__ x, W* __restrict__ out, int64_t n) {
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = from_f32<W>(x[i]);
}

// Four elements per thread per iteration (one 16-byte load, one 8-byte store) over n4 groups
// of four; the launcher passes the tail (n % 4, or everything when unaligned) to the scalar
// kernel below.
__global__ void __launch_bounds__(kThreads, 1)
    round_to_bf16_vec4_kernel(const float4* __restrict__ x, uint2* __restrict__ out, int64_t n4) {
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    // Little-endian: the lower-addressed element is the low half of each 32-bit word.
    out[i] =
        make_uint2(round_to_bf16_bits(v.x) | static_cast<uint32_t>(round_to_bf16_bits(v.y)) << 16,
                   round_to_bf16_bits(v.z) | static_cast<uint32_t>(round_to_bf16_bits(v.w)) << 16);
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    round_to_bf16_kernel(const float* __restrict__ x, uint16_t* __restrict__ out, int64_t n) {
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = round_to_bf16_bits(x[i]);
}

template <class W>
__global__ void __launch_bounds__(kThreads, 1)
    add_bias_kernel(float* __restrict__ out, const W* __restrict__ bias, int64_t n) {
  wait_for_previous_kernel();
  float* row = out + static_cast<int64_t>(blockIdx.x) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) row[i] += to_f32(bias[i]);
}

}  // namespace

void launch_embedding(const void* table, DType table_dtype, const int32_t* ids, int64_t num_tokens,
                      int64_t d, float* out, cudaStream_t stream) {
  if (num_tokens == 0 || d == 0) return;
  dispatch_float_dtype(table_dtype, "embedding table", [&](auto tag) {
    using W = decltype(tag);
    launch_kernel(embedding_kernel<W>, static_cast<unsigned>(num_tokens),
                  row_block_threads(d, kThreads), 0, stream, static_cast<const W*>(table), ids, d,
                  out);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_swiglu(const float* gate, const float* up, void* out, DType out_dtype, int64_t n,
                   cudaStream_t stream) {
  if (n == 0) return;
  dispatch_activation_dtype(out_dtype, "swiglu out", [&](auto tag) {
    using O = decltype(tag);
    launch_kernel(swiglu_kernel<O>, elementwise_blocks(n, kThreads), kThreads, 0, stream, gate, up,
                  static_cast<O*>(out), n);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_add_inplace(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_kernel(add_kernel, elementwise_blocks(n, kThreads), kThreads, 0, stream, x, y, n);
  CUDA_CHECK_LAUNCH();
}

void launch_gather_rows(const void* x, const int32_t* rows, int64_t num_rows, size_t row_bytes,
                        void* out, cudaStream_t stream) {
  if (num_rows == 0 || row_bytes == 0) return;
  const bool words = row_bytes % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 4 == 0 &&
                     reinterpret_cast<uintptr_t>(out) % 4 == 0;
  const unsigned grid = static_cast<unsigned>(num_rows);
  if (words) {
    const int64_t n = static_cast<int64_t>(row_bytes / 4);
    launch_kernel(gather_rows_kernel<uint32_t>, grid, row_block_threads(n, kThreads), 0, stream,
                  static_cast<const uint32_t*>(x), rows, n, static_cast<uint32_t*>(out));
  } else {
    const int64_t n = static_cast<int64_t>(row_bytes);
    launch_kernel(gather_rows_kernel<uint8_t>, grid, row_block_threads(n, kThreads), 0, stream,
                  static_cast<const uint8_t*>(x), rows, n, static_cast<uint8_t*>(out));
  }
  CUDA_CHECK_LAUNCH();
}

void launch_convert_from_f32(const float* x, void* out, DType dtype, int64_t n,
                             cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = elementwise_blocks(n, kThreads);
  if (dtype == DType::BF16) {
    launch_kernel(convert_kernel<__nv_bfloat16>, grid, kThreads, 0, stream, x,
                  static_cast<__nv_bfloat16*>(out), n);
  } else if (dtype == DType::F16) {
    launch_kernel(convert_kernel<__half>, grid, kThreads, 0, stream, x, static_cast<__half*>(out),
                  n);
  } else {
    throw Error("convert_from_f32: target must be BF16 or F16, got " +
                std::string(dtype_name(dtype)));
  }
  CUDA_CHECK_LAUNCH();
}

void launch_round_to_bf16(const float* x, uint16_t* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  int64_t done = 0;
  if (reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0) {
    const int64_t n4 = n / 4;
    if (n4 > 0) {
      launch_kernel(round_to_bf16_vec4_kernel, elementwise_blocks(n4, kThreads), kThreads, 0,
                    stream, reinterpret_cast<const float4*>(x), reinterpret_cast<uint2*>(out), n4);
      CUDA_CHECK_LAUNCH();
    }
    done = n4 * 4;
  }
  if (done < n) {
    launch_kernel(round_to_bf16_kernel, elementwise_blocks(n - done, kThreads), kThreads, 0, stream,
                  x + done, out + done, n - done);
    CUDA_CHECK_LAUNCH();
  }
}

void launch_add_bias(float* out, const void* bias, DType bias_dtype, int64_t rows, int64_t n,
                     cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  dispatch_float_dtype(bias_dtype, "linear bias", [&](auto tag) {
    using W = decltype(tag);
    launch_kernel(add_bias_kernel<W>, static_cast<unsigned>(rows), row_block_threads(n, kThreads),
                  0, stream, out, static_cast<const W*>(bias), n);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
