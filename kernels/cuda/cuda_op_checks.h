// The host-side checks the CudaBackend op bodies share (kernels/cuda/cuda_*_ops.cpp), and the
// helpers one op family's file takes from another's. Backend checked each op's operands
// (engine/core/backend.cpp: shapes, dtypes, aliasing); a body checks what is CUDA's own (that
// the tensors live on the device, the dtypes and sizes its kernels take), then launches on the
// backend stream. Batch metadata comes from the device buffers prepare_batch filled; the checks
// that need the cache shape (slots, block ids, positions against block tables) run on the
// host once per prepared batch and cache shape.
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

inline float* f32(Tensor& t) { return t.ptr<float>(); }
inline const float* f32(const Tensor& t) { return t.ptr<float>(); }

// The Phase-2 merge without the §2d switches or newer entries (block mode's): the one
// launch_depth_phase2_prenorm and the GEMV's PreNorm prologue compute.
inline bool is_plain_mix(const Backend::DepthMixArgs& mix) {
  return mix.partial_is_source && !mix.newer && !mix.adds_partial && !mix.null_source &&
         mix.gate == Backend::DepthGate::None;
}

// --- defined in cuda_linear_ops.cpp ---
// A decode-sized GEMV segment for linear_many / linear_swiglu (operands on the device);
// nullopt when the fused launch does not apply (more rows than the GEMV takes, an empty
// reduction, a weight dtype other than the first segment's, or a bf16 x).
std::optional<cuda::GemvSegment> gemv_segment(const Tensor& x, const Tensor& w, const Tensor* bias,
                                              Tensor& out, DType first_dtype);

// --- defined in cuda_prenorm_ops.cpp ---
// The GEMV prologue's form of a PreNorm (cuda_gemv_prenorm.cu), what it reads on the device;
// nullopt for a mix the prologue does not compute (the §2d switches,
// newer entries), which the two-launch default then runs.
std::optional<cuda::GemvPrenorm> gemv_prenorm(const Backend::PrenormArgs& in);

// --- defined in cuda_norm_rope_ops.cpp ---
// qk_norm_rope's operands on the device, inv_freq F32 (the kernel reads it so); the kernel's
// parameters (all but the cache's).
cuda::RopeStoreParams checked_rope(Tensor& q, Tensor& k, int head_dim, const Tensor* q_gain,
                                   const Tensor* k_gain, float eps, const Tensor& inv_freq,
                                   const BatchMeta& batch);

// --- defined in cuda_attention_ops.cpp ---
// A KV cache layer on the device (Backend checked its shape and dtype).
void check_cache(const KvCacheLayer& cache);
// store_kv's operands on the device; the cache row's values (Hkv * hd).
int64_t check_store_kv(const Tensor& k, const Tensor& v, const BatchMeta& batch,
                       const KvCacheLayer& cache);

}  // namespace attnres::cuda_ops
