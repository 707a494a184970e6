// rms_norm and qk_norm_rope.
//
// rms_norm: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * gain, x/out [R, n] f32, gain [n] in
// any float dtype. One block per row (enough warps to cover the row once, up to 1024
// threads); pass 1 sums squares in f32 with a warp-shuffle + shared-memory block reduction,
// pass 2 scales. A thread reads x[i] before it writes out[i] and no thread touches another's
// elements after the reduction barrier, so x and out may alias. out may be bf16 (rounded from
// the f32 value: the normed rows as a prefill GEMM's input, cuda_activation.cuh).
//
// qk_norm_rope: one block per token handling all its heads (q then k). The block first
// builds the token's cos/sin table [hd / 2] in shared memory, with the angle
// position * inv_freq formed in double exactly like the CPU reference (so long contexts stay
// accurate; it costs hd/2 double sincos per token, nothing next to the GEMMs). Then each
// warp takes one head at a time: optional per-head RMSNorm (warp_sum over hd), then the
// rotate-half rotation; lane j owns the pairs (i, i + hd/2) for i = j, j + 32, ..., so
// every element is read and written by one lane only.
//
// qk_norm_rope_store (decode's launch count: RoPE and the KV store in one launch): the same
// kernel with two more kinds of warp unit after the q and k heads. A k head's lane writes
// each roped value to k (in place, as qk_norm_rope leaves it) and to the token's cache row
// slots[t], converted as store_kv converts it (bf16: round to nearest even, NaN kept quiet,
// cuda_bf16_round.h); a v head is copied into the cache row the same way. The roped values
// come from the one code path, so q, k and the cache hold what qk_norm_rope then store_kv
// write, bit for bit.
#include "kernels/cuda/cuda_activation.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_prenorm_rows.cuh"
#include "kernels/cuda/cuda_rope_rows.cuh"

namespace attnres::cuda {
namespace {

// O: float, or uint16_t (bf16 bits: the normed rows as a GEMM's input, cuda_activation.cuh).
template <class G, class O>
__global__ void __launch_bounds__(kMaxRowThreads, 1)
    rms_norm_kernel(const float* x, const G* __restrict__ gain, float eps, int64_t n, O* out) {
  wait_for_previous_kernel();
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  O* outr = out + static_cast<int64_t>(blockIdx.x) * n;
  // cuda_prenorm_rows.cuh's arithmetic: the GEMV's PreNorm prologue repeats it bit for bit.
  const float ss = block_sum(prenorm_sum_squares(xr, n, threadIdx.x, blockDim.x));
  const float inv_rms = prenorm_inv_rms(ss, n, eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    store_activation(outr + i, prenorm_scale(xr[i], inv_rms, to_f32(gain[i])));
}

constexpr int kRopeThreads = 256;  // 8 warps: 8 heads in flight per token

// kStore false: qk_norm_rope (the cache fields unused). kStore true: the same, then the roped
// k head and the v head written into cache row slots[t] (S: float or the bf16 bits); q and k
// keep their roped values in place either way, computed by the same code
// (cuda_rope_rows.cuh, which the QKV GEMV's epilogue shares).
template <class S, bool kStore>
__global__ void __launch_bounds__(kRopeThreads, 1) qk_norm_rope_kernel(RopeStoreParams p) {
  extern __shared__ float table[];  // cos [half], then sin [half]
  wait_for_previous_kernel();
  const int hd = p.head_dim, hq = p.hq, hkv = p.hkv;
  const int half = hd / 2;
  float* cos_t = table;
  float* sin_t = table + half;
  const int64_t t = blockIdx.x;
  for (int i = threadIdx.x; i < half; i += blockDim.x)
    rope_cos_sin(p.positions[t], p.inv_freq[i], cos_t[i], sin_t[i]);
  __syncthreads();

  const int64_t row_elems = static_cast<int64_t>(hkv) * hd;  // a cache row: Hkv * hd
  S* k_row = nullptr;
  S* v_row = nullptr;
  if constexpr (kStore) {
    const int64_t slot = p.slots[t];
    k_row = static_cast<S*>(p.k_cache) + slot * row_elems;
    v_row = static_cast<S*>(p.v_cache) + slot * row_elems;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  // Units: the q heads, the k heads, then (kStore) the v heads, which are only copied.
  const int units = hq + hkv + (kStore ? hkv : 0);
  for (int head = warp; head < units; head += num_warps) {
    if (kStore && head >= hq + hkv) {
      const int kv_head = head - hq - hkv;
      const float* v = p.v + t * row_elems + static_cast<int64_t>(kv_head) * hd;
      for (int i = lane; i < hd; i += 32) store_cached(v_row + kv_head * hd + i, v[i]);
      continue;
    }
    const bool is_q = head < hq;
    float* x = is_q ? p.q + (t * hq + head) * hd : p.k + (t * hkv + (head - hq)) * hd;
    S* cached = kStore && !is_q ? k_row + static_cast<int64_t>(head - hq) * hd : nullptr;
    norm_rope_head(x, x, cached, hd, is_q ? p.q_gain : p.k_gain,
                   is_q ? p.q_gain_dtype : p.k_gain_dtype, p.eps, cos_t, sin_t, lane);
    __syncwarp();
  }
}

void launch_rope(const RopeStoreParams& p, bool store, cudaStream_t stream) {
  if (p.num_tokens == 0) return;
  const unsigned grid = static_cast<unsigned>(p.num_tokens);
  const size_t smem = static_cast<size_t>(p.head_dim) * sizeof(float);  // cos + sin, hd/2 each
  if (!store) {
    launch_kernel(qk_norm_rope_kernel<float, false>, grid, dim3(kRopeThreads), smem, stream, p);
  } else if (p.cache_dtype == DType::F32) {
    launch_kernel(qk_norm_rope_kernel<float, true>, grid, dim3(kRopeThreads), smem, stream, p);
  } else if (p.cache_dtype == DType::BF16) {
    launch_kernel(qk_norm_rope_kernel<uint16_t, true>, grid, dim3(kRopeThreads), smem, stream, p);
  } else {
    throw Error("qk_norm_rope_store: the CUDA kv cache must be F32 or BF16, got " +
                std::string(dtype_name(p.cache_dtype)));
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace

void launch_rms_norm(const float* x, const void* gain, DType gain_dtype, float eps, int64_t rows,
                     int64_t n, void* out, DType out_dtype, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  dispatch_float_dtype(gain_dtype, "rms_norm gain", [&](auto tag) {
    using G = decltype(tag);
    dispatch_activation_dtype(out_dtype, "rms_norm out", [&](auto out_tag) {
      using O = decltype(out_tag);
      launch_kernel(rms_norm_kernel<G, O>, static_cast<unsigned>(rows), row_block_threads(n), 0,
                    stream, x, static_cast<const G*>(gain), eps, n, static_cast<O*>(out));
    });
  });
  CUDA_CHECK_LAUNCH();
}

void launch_qk_norm_rope(float* q, float* k, int64_t num_tokens, int hq, int hkv, int head_dim,
                         const void* q_gain, DType q_gain_dtype, const void* k_gain,
                         DType k_gain_dtype, float eps, const float* inv_freq,
                         const int32_t* positions, cudaStream_t stream) {
  RopeStoreParams p;
  p.q = q;
  p.k = k;
  p.num_tokens = num_tokens;
  p.hq = hq;
  p.hkv = hkv;
  p.head_dim = head_dim;
  p.q_gain = q_gain;
  p.q_gain_dtype = q_gain_dtype;
  p.k_gain = k_gain;
  p.k_gain_dtype = k_gain_dtype;
  p.eps = eps;
  p.inv_freq = inv_freq;
  p.positions = positions;
  launch_rope(p, false, stream);
}

void launch_qk_norm_rope_store(const RopeStoreParams& params, cudaStream_t stream) {
  launch_rope(params, true, stream);
}

}  // namespace attnres::cuda
