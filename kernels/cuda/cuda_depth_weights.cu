// Depth-attention weights of one mixing step, for introspection (ATTNRES.md §5), per token t:
//   logit_j = query . src_j / rms(src_j)  (+ bias for j = n)     rms(x) = sqrt(mean(x^2) + eps)
//   out[t, j] = softmax_j(logit)          src_j = bank[j, t] (j < n), src_n = partial[t]
// Layout: query [d], bank [>= n, T, d] (first n live), partial [T, d], out [T, n + 1], f32.
// One block per token. For each source the block makes one pass over the row computing the
// dot product and the sum of squares together (one block_sum_n<2>), exactly like Phase 1's
// logits; thread 0 keeps the n + 1 logits in dynamic shared memory and, after the last one,
// writes the max-subtracted softmax. The forward runs this only when a request asked for the
// weights, so the serial softmax over n + 1 values (a few dozen at most) is not worth more.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

__global__ void depth_weights_kernel(const float* __restrict__ query,
                                     const float* __restrict__ bank, int n,
                                     const float* __restrict__ partial, float bias, float eps,
                                     int64_t T, int64_t d, float* __restrict__ out) {
  extern __shared__ float logits[];  // [n + 1], written by thread 0
  const int64_t t = blockIdx.x;
  for (int j = 0; j <= n; ++j) {
    const float* row = j < n ? bank + (static_cast<int64_t>(j) * T + t) * d : partial + t * d;
    float acc[2] = {0.0f, 0.0f};  // query . row, row . row
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const float x = row[i];
      acc[0] += query[i] * x;
      acc[1] += x * x;
    }
    block_sum_n<2>(acc);
    if (threadIdx.x == 0) {
      logits[j] = acc[0] / sqrtf(acc[1] / static_cast<float>(d) + eps) + (j == n ? bias : 0.0f);
    }
  }
  if (threadIdx.x != 0) return;
  float big = logits[0];
  for (int j = 1; j <= n; ++j) big = fmaxf(big, logits[j]);
  float sum = 0.0f;
  for (int j = 0; j <= n; ++j) sum += (logits[j] = expf(logits[j] - big));
  const float inv = 1.0f / sum;
  float* w = out + t * (n + 1);
  for (int j = 0; j <= n; ++j) w[j] = logits[j] * inv;
}

}  // namespace

void launch_depth_weights(const float* query, const float* bank, int n, const float* partial,
                          float bias, float eps, int64_t num_tokens, int64_t d, float* out,
                          cudaStream_t stream) {
  if (num_tokens == 0) return;
  const size_t shared = static_cast<size_t>(n + 1) * sizeof(float);
  depth_weights_kernel<<<static_cast<unsigned>(num_tokens), row_block_threads(d), shared, stream>>>(
      query, bank, n, partial, bias, eps, num_tokens, d, out);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
