// CudaBackend rms_norm, qk_norm_rope and qk_norm_rope_store (the kernels: cuda_norm_rope.cu).
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

void CudaBackend::rms_norm_impl(const Tensor& x, const Tensor& gain, float eps, Tensor& out) {
  check_cuda(x, "rms_norm x");
  check_cuda(out, "rms_norm out");
  check_cuda(gain, "rms_norm gain");
  const int64_t n = x.dim(-1);
  cuda::launch_rms_norm(f32(x), gain.data, gain.dtype, eps, rows_of(x), n, out.data, out.dtype,
                        on_device().stream);
}

cuda::RopeStoreParams cuda_ops::checked_rope(Tensor& q, Tensor& k, int head_dim,
                                             const Tensor* q_gain, const Tensor* k_gain, float eps,
                                             const Tensor& inv_freq, const BatchMeta& batch) {
  (void)batch;  // Backend checked its positions against q and k
  const int64_t hd = head_dim;
  check_cuda(q, "qk_norm_rope q");
  check_cuda(k, "qk_norm_rope k");
  const int64_t T = rows_of(q);
  check_cuda(inv_freq, "qk_norm_rope inv_freq");
  ATTNRES_CHECK(inv_freq.dtype == DType::F32,
                "qk_norm_rope inv_freq " + shape_str(inv_freq.shape) + " must be F32 [hd / 2]");
  const bool has_qg = q_gain && q_gain->defined(), has_kg = k_gain && k_gain->defined();
  if (has_qg) check_cuda(*q_gain, "q_gain");
  if (has_kg) check_cuda(*k_gain, "k_gain");
  cuda::RopeStoreParams p;
  p.q = f32(q);
  p.k = f32(k);
  p.num_tokens = T;
  p.hq = static_cast<int>(q.dim(-1) / hd);
  p.hkv = static_cast<int>(k.dim(-1) / hd);
  p.head_dim = static_cast<int>(hd);
  p.q_gain = has_qg ? q_gain->data : nullptr;
  p.q_gain_dtype = has_qg ? q_gain->dtype : DType::F32;
  p.k_gain = has_kg ? k_gain->data : nullptr;
  p.k_gain_dtype = has_kg ? k_gain->dtype : DType::F32;
  p.eps = eps;
  p.inv_freq = f32(inv_freq);
  return p;
}

void CudaBackend::qk_norm_rope_impl(Tensor& q, Tensor& k, int head_dim, const Tensor* q_gain,
                                    const Tensor* k_gain, float eps, const Tensor& inv_freq,
                                    const BatchMeta& batch) {
  Impl& im = on_device();
  const cuda::RopeStoreParams p =
      checked_rope(q, k, head_dim, q_gain, k_gain, eps, inv_freq, batch);
  im.ensure_prepared(*this, batch);
  cuda::launch_qk_norm_rope(p.q, p.k, p.num_tokens, p.hq, p.hkv, p.head_dim, p.q_gain,
                            p.q_gain_dtype, p.k_gain, p.k_gain_dtype, p.eps, p.inv_freq,
                            im.positions, im.stream);
}

void CudaBackend::qk_norm_rope_store_impl(Tensor& q, Tensor& k, const Tensor& v, int head_dim,
                                          const Tensor* q_gain, const Tensor* k_gain, float eps,
                                          const Tensor& inv_freq, const BatchMeta& batch,
                                          KvCacheLayer& cache) {
  Impl& im = on_device();
  cuda::RopeStoreParams p = checked_rope(q, k, head_dim, q_gain, k_gain, eps, inv_freq, batch);
  check_store_kv(k, v, batch, cache);
  im.ensure_prepared(*this, batch);
  im.validate_against_cache(batch, cache);
  p.v = f32(v);
  p.positions = im.positions;
  p.slots = im.slot_mapping;
  p.k_cache = cache.k.data;
  p.v_cache = cache.v.data;
  p.cache_dtype = cache.k.dtype;
  cuda::launch_qk_norm_rope_store(p, im.stream);
}

}  // namespace attnres
