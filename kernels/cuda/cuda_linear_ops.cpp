// CudaBackend linear ops (the kernels: cuda_gemv.cu, cuda_gemv_push.cu, cuda_lt_gemm.cpp).
//
// linear: up to 8 rows (decode) run the GEMV kernel of cuda_gemv.cu (x stays f32, bias
// fused, matches the CPU to f32 rounding); under the bank-push lever linear_residual_push's
// GEMV stores the bf16 entry too (cuda_gemv_push.cu). More rows go through cuBLAS. Weights
// are [N, K] row-major, which is column-major [K, N]; x [R, K] row-major is column-major
// [K, R]; out [R, N] row-major is column-major [N, R]. So
//   out_cm[N, R] = W_cm^T [N, K] * x_cm [K, R]:  cublasGemmEx(OP_T, OP_N, m=N, n=R, k=K,
//   A=W lda=K, B=x ldb=K, C=out ldc=N)
// F32 weights: an f32 GEMM with CUBLAS_COMPUTE_32F (no TF32), matching the CPU to f32
// rounding. BF16 / F16 weights: cuBLAS needs A and B of one type, so an f32 x is first rounded
// to the weight dtype into a scratch buffer (launch_convert_from_f32); the GEMM accumulates
// in f32 and writes f32. A bf16 x (linear_input_dtype: the forward had its producer write it
// rounded, the same bits) goes to the GEMM as it is, whatever its row count. That rounding of the
// activations (the CPU keeps them f32) makes the result match the CPU to bf16 precision (~1e-3
// relative), not f32. The GEMM is cuBLASLt's (cuda_lt_gemm.h) with an f32 bias in its epilogue; a
// bias of another dtype is a separate small kernel (the model widens its biases to f32 at load, so
// that is rare).
#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_backend_internal.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_op_checks.h"

namespace attnres {
using namespace cuda_ops;

void CudaBackend::linear_impl(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out) {
  Impl& im = on_device();
  check_cuda(w, "linear w");
  check_cuda(x, "linear x");
  check_cuda(out, "linear out");
  if (bias) check_cuda(*bias, "linear bias");
  const int64_t n_dim = w.dim(0), k_dim = w.dim(1);
  const int64_t r_dim = rows_of(x);
  const bool bf16_x = x.dtype == DType::BF16;  // with BF16 weights (Backend checked)
  if (r_dim == 0 || n_dim == 0) return;
  // decode: f32 x, bias fused, one launch
  if (r_dim <= cuda::kMaxGemvRows && k_dim > 0 && !bf16_x) {
    cuda::launch_gemv(f32(x), r_dim, w.data, w.dtype, bias ? bias->data : nullptr,
                      bias ? bias->dtype : DType::F32, k_dim, n_dim, f32(out), im.stream);
    return;
  }
  if (k_dim == 0) {  // empty sum: out = bias or 0
    fill_zero(out);
  } else {
    ATTNRES_CHECK(n_dim <= INT32_MAX && k_dim <= INT32_MAX && r_dim <= INT32_MAX,
                  "linear: dimension too large for cuBLAS int arguments");
    const int m = static_cast<int>(n_dim), n = static_cast<int>(r_dim), k = static_cast<int>(k_dim);
    const float alpha = 1.0f, beta = 0.0f;
    const void* b_ptr = x.data;
    cudaDataType_t ab_type = CUDA_R_32F;
    if (bf16_x) {
      ab_type = CUDA_R_16BF;  // rounded by its producer: no conversion
    } else if (w.dtype == DType::BF16 || w.dtype == DType::F16) {
      ab_type = w.dtype == DType::BF16 ? CUDA_R_16BF : CUDA_R_16F;
      const size_t bytes = static_cast<size_t>(r_dim * k_dim) * 2;
      if (bytes > im.act_scratch_bytes) {
        const size_t grown = std::max(bytes, im.act_scratch_bytes * 2);
        im.act_scratch = im.raw_alloc(grown);  // stream-ordered reuse of the old block is safe
        im.act_scratch_bytes = grown;
      }
      cuda::launch_convert_from_f32(f32(x), im.act_scratch.get(), w.dtype, r_dim * k_dim,
                                    im.stream);
      b_ptr = im.act_scratch.get();
    } else {  // F32: the other dtypes are not in cuda_backend_capabilities().weight_dtypes
      ATTNRES_CHECK(w.dtype == DType::F32,
                    "linear w dtype " + std::string(dtype_name(w.dtype)) + " is not supported");
    }
    // cuBLASLt, an f32 bias in its epilogue; cublasGemmEx where it has no algorithm.
    const float* epilogue_bias =
        bias && bias->dtype == DType::F32 ? static_cast<const float*>(bias->data) : nullptr;
    const cuda::LtGemmArgs gemm{r_dim, k_dim,         n_dim,   ab_type, w.data,
                                b_ptr, epilogue_bias, nullptr, f32(out)};
    im.launch->cublas_calls.fetch_add(1, std::memory_order_relaxed);
    if (im.lt_gemm->run(gemm, im.stream)) {
      if (epilogue_bias) return;
    } else {
      CUBLAS_CHECK(cublasGemmEx(im.cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w.data,
                                ab_type, k, b_ptr, ab_type, k, &beta, out.data, CUDA_R_32F, m,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
  }
  if (bias) cuda::launch_add_bias(f32(out), bias->data, bias->dtype, r_dim, n_dim, im.stream);
}

void CudaBackend::linear_residual_impl(const Tensor& x, const Tensor& w, const Tensor* bias,
                                       const Tensor& residual, Tensor& out) {
  Impl& im = on_device();
  check_cuda(residual, "linear_residual residual");
  check_cuda(out, "linear_residual out");
  check_cuda(x, "linear_residual x");
  check_cuda(w, "linear_residual w");
  if (bias) check_cuda(*bias, "linear_residual bias");
  const int64_t n_dim = w.dim(0), k_dim = w.dim(1);
  const int64_t r_dim = rows_of(x);
  // prefill (or a bf16 x): cuBLAS, then the add
  if (r_dim > cuda::kMaxGemvRows || k_dim == 0 || x.dtype != DType::F32) {
    Backend::linear_residual_impl(x, w, bias, residual, out);
    return;
  }
  cuda::launch_gemv_residual(f32(x), r_dim, w.data, w.dtype, bias ? bias->data : nullptr,
                             bias ? bias->dtype : DType::F32, k_dim, n_dim, f32(residual), f32(out),
                             im.stream);
}

void CudaBackend::linear_residual_push_impl(const Tensor& x, const Tensor& w, const Tensor* bias,
                                            const Tensor& residual, Tensor& out, Tensor& entry) {
  Impl& im = on_device();
  check_cuda(entry, "linear_residual_push entry");
  const int64_t n_dim = w.dim(0), k_dim = w.dim(1);
  const int64_t r_dim = rows_of(x);
  // The lever off, or not the GEMV path (more rows, a bf16 x) or not a bf16 entry: the
  // separate ops (linear_residual, then copy's rounding).
  if (!im.bank_push_epilogue || r_dim > cuda::kMaxGemvRows || k_dim == 0 ||
      x.dtype != DType::F32 || entry.dtype != DType::BF16) {
    Backend::linear_residual_push_impl(x, w, bias, residual, out, entry);
    return;
  }
  check_cuda(residual, "linear_residual_push residual");
  check_cuda(out, "linear_residual_push out");
  check_cuda(x, "linear_residual_push x");
  check_cuda(w, "linear_residual_push w");
  if (bias) check_cuda(*bias, "linear_residual_push bias");
  cuda::launch_gemv_residual_push(f32(x), r_dim, w.data, w.dtype, bias ? bias->data : nullptr,
                                  bias ? bias->dtype : DType::F32, k_dim, n_dim, f32(residual),
                                  f32(out), static_cast<uint16_t*>(entry.data), im.stream);
}

std::optional<cuda::GemvSegment> cuda_ops::gemv_segment(const Tensor& x, const Tensor& w,
                                                        const Tensor* bias, Tensor& out,
                                                        DType first_dtype) {
  check_cuda(w, "linear w");
  check_cuda(x, "linear x");
  check_cuda(out, "linear out");
  if (bias) check_cuda(*bias, "linear bias");
  const int64_t n_dim = w.dim(0), k_dim = w.dim(1);
  if (rows_of(x) > cuda::kMaxGemvRows || k_dim == 0 || w.dtype != first_dtype ||
      x.dtype != DType::F32)
    return std::nullopt;
  return cuda::GemvSegment{
      w.data, bias ? bias->data : nullptr, bias ? bias->dtype : DType::F32, n_dim, f32(out),
      nullptr};
}

void CudaBackend::linear_many_impl(const Tensor& x, std::span<const LinearTarget> targets) {
  Impl& im = on_device();
  cuda::GemvSegments segments;
  bool fused = !targets.empty() && targets.size() <= cuda::kMaxGemvSegments;
  for (const LinearTarget& t : targets) {
    const auto seg = gemv_segment(x, *t.w, t.bias, *t.out, targets[0].w->dtype);
    fused = fused && seg.has_value();
    if (fused) segments.seg[segments.count++] = *seg;
  }
  if (!fused || rows_of(x) == 0) {  // the prefill path: cuBLAS per target
    Backend::linear_many_impl(x, targets);
    return;
  }
  cuda::launch_gemv_many(f32(x), rows_of(x), x.dim(-1), targets[0].w->dtype, segments, im.stream);
}

void CudaBackend::linear_swiglu_impl(const Tensor& x, const Tensor& w_gate, const Tensor* b_gate,
                                     const Tensor& w_up, const Tensor* b_up, Tensor& gate,
                                     Tensor& up, Tensor& out) {
  Impl& im = on_device();
  const auto g = gemv_segment(x, w_gate, b_gate, gate, w_gate.dtype);
  const auto u = gemv_segment(x, w_up, b_up, up, w_gate.dtype);
  // A prefill's out may be BF16: the down projection's input, rounded by swiglu's store.
  check_cuda(out, "linear_swiglu out");
  if (!g || !u || rows_of(x) == 0 || out.dtype != DType::F32) {  // prefill: two GEMMs, swiglu
    Backend::linear_swiglu_impl(x, w_gate, b_gate, w_up, b_up, gate, up, out);
    return;
  }
  cuda::launch_gemv_swiglu(f32(x), rows_of(x), x.dim(-1), w_gate.dtype, *g, *u, f32(out),
                           im.stream);
}

}  // namespace attnres
