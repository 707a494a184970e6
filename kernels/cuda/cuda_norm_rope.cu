// rms_norm and qk_norm_rope.
//
// rms_norm: out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * gain, x/out [R, n] f32, gain [n] in
// any float dtype. One block per row (enough warps to cover the row once, up to 1024
// threads); pass 1 sums squares in f32 with a warp-shuffle + shared-memory block reduction,
// pass 2 scales. A thread reads x[i] before it writes out[i] and no thread touches another's
// elements after the reduction barrier, so x and out may alias.
//
// qk_norm_rope: one block per token handling all its heads (q then k). The block first
// builds the token's cos/sin table [hd / 2] in shared memory, with the angle
// position * inv_freq formed in double exactly like the CPU reference (so long contexts stay
// accurate; it costs hd/2 double sincos per token, nothing next to the GEMMs). Then each
// warp takes one head at a time: optional per-head RMSNorm (warp_sum over hd), then the
// rotate-half rotation; lane j owns the pairs (i, i + hd/2) for i = j, j + 32, ..., so
// every element is read and written by one lane only.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

template <class G>
__global__ void __launch_bounds__(kMaxRowThreads, 1)
    rms_norm_kernel(const float* x, const G* __restrict__ gain, float eps, int64_t n, float* out) {
  wait_for_previous_kernel();
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  float* outr = out + static_cast<int64_t>(blockIdx.x) * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  ss = block_sum(ss);
  const float inv_rms = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) outr[i] = xr[i] * inv_rms * to_f32(gain[i]);
}

constexpr int kRopeThreads = 256;  // 8 warps: 8 heads in flight per token

__global__ void __launch_bounds__(kRopeThreads, 1)
    qk_norm_rope_kernel(float* q, float* k, int hq, int hkv, int hd, const void* q_gain,
                        DType q_gain_dtype, const void* k_gain, DType k_gain_dtype, float eps,
                        const float* __restrict__ inv_freq, const int32_t* __restrict__ positions) {
  wait_for_previous_kernel();
  extern __shared__ float table[];  // cos [half], then sin [half]
  const int half = hd / 2;
  float* cos_t = table;
  float* sin_t = table + half;
  const int64_t t = blockIdx.x;
  const double pos = positions[t];
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const double angle = pos * static_cast<double>(inv_freq[i]);
    double s, c;
    sincos(angle, &s, &c);
    cos_t[i] = static_cast<float>(c);
    sin_t[i] = static_cast<float>(s);
  }
  __syncthreads();

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, num_warps = blockDim.x >> 5;
  for (int head = warp; head < hq + hkv; head += num_warps) {
    const bool is_q = head < hq;
    float* x = is_q ? q + (t * hq + head) * hd : k + (t * hkv + (head - hq)) * hd;
    const void* gain = is_q ? q_gain : k_gain;
    const DType gain_dtype = is_q ? q_gain_dtype : k_gain_dtype;
    float inv_rms = 1.0f;
    if (gain) {
      float ss = 0.0f;
      for (int i = lane; i < hd; i += 32) ss += x[i] * x[i];
      ss = warp_sum(ss);  // every lane's loads are done before any lane stores below
      inv_rms = 1.0f / sqrtf(ss / static_cast<float>(hd) + eps);
    }
    for (int i = lane; i < half; i += 32) {
      float a = x[i], b = x[i + half];
      if (gain) {
        a = a * inv_rms * load_float(gain, gain_dtype, i);
        b = b * inv_rms * load_float(gain, gain_dtype, i + half);
      }
      x[i] = a * cos_t[i] - b * sin_t[i];
      x[i + half] = b * cos_t[i] + a * sin_t[i];
    }
    __syncwarp();
  }
}

}  // namespace

void launch_rms_norm(const float* x, const void* gain, DType gain_dtype, float eps, int64_t rows,
                     int64_t n, float* out, cudaStream_t stream) {
  if (rows == 0 || n == 0) return;
  dispatch_float_dtype(gain_dtype, "rms_norm gain", [&](auto tag) {
    using G = decltype(tag);
    launch_kernel(rms_norm_kernel<G>, static_cast<unsigned>(rows), row_block_threads(n), 0, stream,
                  x, static_cast<const G*>(gain), eps, n, out);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_qk_norm_rope(float* q, float* k, int64_t num_tokens, int hq, int hkv, int head_dim,
                         const void* q_gain, DType q_gain_dtype, const void* k_gain,
                         DType k_gain_dtype, float eps, const float* inv_freq,
                         const int32_t* positions, cudaStream_t stream) {
  if (num_tokens == 0) return;
  const size_t smem = static_cast<size_t>(head_dim) * sizeof(float);  // cos + sin, hd/2 each
  launch_kernel(qk_norm_rope_kernel, static_cast<unsigned>(num_tokens), kRopeThreads, smem, stream,
                q, k, hq, hkv, head_dim, q_gain, q_gain_dtype, k_gain, k_gain_dtype, eps, inv_freq,
                positions);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
