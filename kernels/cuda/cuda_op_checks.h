// The host-side checks the CudaBackend ops share (kernels/cuda/cuda_*_ops.cpp), and the
// helpers one op family's file takes from another's. The ops validate shapes / dtypes /
// devices on the host (ATTNRES_CHECK, like the CPU reference), then launch on the backend
// stream. Batch metadata comes from the device buffers prepare_batch filled; the checks that
// need the cache shape (slots, block ids, positions against block tables) run on the host
// once per prepared batch and cache shape.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/core/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda_ops {

inline int64_t rows_of(const Tensor& t) {
  if (t.rank() == 0) return 1;
  return t.dim(-1) ? t.numel() / t.dim(-1) : 0;
}

inline void check_cuda(const Tensor& t, const char* what) {
  ATTNRES_CHECK(t.defined() || t.numel() == 0, std::string(what) + " is undefined");
  ATTNRES_CHECK(t.device == Device::CUDA, std::string(what) + " is not a CUDA tensor");
}

// A CUDA f32 tensor whose last dimension is n.
inline void check_f32_rows(const Tensor& t, int64_t n, const char* what) {
  check_cuda(t, what);
  ATTNRES_CHECK(t.dtype == DType::F32,
                std::string(what) + " must be F32, got " + std::string(dtype_name(t.dtype)));
  ATTNRES_CHECK(t.rank() >= 1 && t.dim(-1) == n, std::string(what) + " " + shape_str(t.shape) +
                                                     ": last dim must be " + std::to_string(n));
}

// A CUDA vector of n floats of any float dtype (gains, biases).
inline void check_float_vector(const Tensor& t, int64_t n, const char* what) {
  check_cuda(t, what);
  ATTNRES_CHECK(t.numel() == n && t.dtype != DType::I32,
                std::string(what) + " " + shape_str(t.shape) + " " +
                    std::string(dtype_name(t.dtype)) + ": expected " + std::to_string(n) +
                    " float values");
}

// A CUDA depth bank (or a view of its entries) whose last dimension is d, of a dtype the depth
// kernels read (cuda_backend_capabilities().depth_bank_dtypes: F32, BF16).
inline void check_bank(const Tensor& t, int64_t d, const char* what) {
  check_cuda(t, what);
  ATTNRES_CHECK(cuda_backend_capabilities().depth_bank_dtypes.contains(t.dtype),
                std::string(what) + " is " + std::string(dtype_name(t.dtype)) +
                    ": the CUDA depth ops read an F32 or BF16 bank");
  ATTNRES_CHECK(t.rank() >= 1 && t.dim(-1) == d, std::string(what) + " " + shape_str(t.shape) +
                                                     ": last dim must be " + std::to_string(d));
}

// A linear's x: a CUDA tensor whose last dimension is k, F32, or BF16 (linear_input_dtype).
inline void check_linear_input(const Tensor& x, int64_t k, const char* what) {
  check_cuda(x, what);
  ATTNRES_CHECK(
      x.dtype == DType::F32 || x.dtype == DType::BF16,
      std::string(what) + " must be F32 or BF16, got " + std::string(dtype_name(x.dtype)));
  ATTNRES_CHECK(x.rank() >= 1 && x.dim(-1) == k, std::string(what) + " " + shape_str(x.shape) +
                                                     ": last dim must be " + std::to_string(k));
}

// An op's out that may hold a linear's input: F32, or BF16 (then apart from the op's f32
// input `in`, which an f32 out may alias).
inline void check_activation_out(const Tensor& out, int64_t n, const Tensor& in, const char* what) {
  check_linear_input(out, n, what);
  if (out.dtype == DType::F32) return;
  const auto* o0 = static_cast<const char*>(out.data);
  const auto* i0 = static_cast<const char*>(in.data);
  ATTNRES_CHECK(
      out.nbytes() == 0 || in.nbytes() == 0 || o0 + out.nbytes() <= i0 || i0 + in.nbytes() <= o0,
      std::string(what) + ": a BF16 out must not overlap the input");
}

inline float* f32(Tensor& t) { return t.ptr<float>(); }
inline const float* f32(const Tensor& t) { return t.ptr<float>(); }

// The Phase-2 merge without the §2d switches or newer entries (block mode's): the one
// launch_depth_phase2_prenorm and the GEMV's PreNorm prologue compute.
inline bool is_plain_mix(const Backend::DepthMixArgs& mix) {
  return mix.partial_is_source && !mix.newer && !mix.adds_partial && !mix.null_source &&
         mix.gate == Backend::DepthGate::None;
}

// --- defined in cuda_linear_ops.cpp ---
// A decode-sized GEMV segment for linear_many / linear_swiglu, after the checks linear() does;
// nullopt when the fused launch does not apply (more rows than the GEMV takes, an empty
// reduction, a weight dtype other than the first segment's, or a bf16 x).
std::optional<cuda::GemvSegment> gemv_segment(const Tensor& x, const Tensor& w, const Tensor* bias,
                                              Tensor& out, DType first_dtype);

// --- defined in cuda_prenorm_ops.cpp ---
// The GEMV prologue's form of a PreNorm (cuda_gemv_prenorm.cu), after depth_phase2_prenorm's
// checks on what it reads; nullopt for a mix the prologue does not compute (the §2d switches,
// newer entries), which the two-launch default then runs.
std::optional<cuda::GemvPrenorm> gemv_prenorm(const Backend::PrenormArgs& in);

// --- defined in cuda_norm_rope_ops.cpp ---
// qk_norm_rope's checks; the kernel's parameters (all but the cache's).
cuda::RopeStoreParams checked_rope(Tensor& q, Tensor& k, int head_dim, const Tensor* q_gain,
                                   const Tensor* k_gain, float eps, const Tensor& inv_freq,
                                   const BatchMeta& batch);

// --- defined in cuda_attention_ops.cpp ---
// A KV cache layer's checks: K and V of one shape [blocks, block, Hkv, hd], one dtype the
// kernels read (F32, BF16), on the device.
void check_cache(const KvCacheLayer& cache);
// store_kv's checks; the cache row's values (Hkv * hd).
int64_t check_store_kv(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                       const KvCacheLayer& cache);

}  // namespace attnres::cuda_ops
