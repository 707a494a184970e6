// Depth-attention weights of one mixing step, for introspection (ATTNRES.md §5), per token t:
//   logit_j = query . src_j / rms(src_j)  (+ bias on the partial)  rms(x) = sqrt(mean(x^2) + eps)
//   out[t, j] = softmax_j(logit)
// over [null source (constant logit)?] + bank[0, n) + [partial?] (ATTNRES.md §2d); under
// pre_gated each bank source is sigmoid(gate logits[t]) * bank[j, t] first.
// Layout: query [d], bank [>= n, T, d] (first n live), partial [T, d], out [T, width], f32.
// One block per token. For each source the block makes one pass over the row computing the
// dot product and the sum of squares together (one block_sum_n<2>), exactly like Phase 1's
// logits; thread 0 keeps the n + 1 logits in dynamic shared memory and, after the last one,
// writes the max-subtracted softmax. The forward runs this only when a request asked for the
// weights, so the serial softmax over n + 1 values (a few dozen at most) is not worth more.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

__global__ void __launch_bounds__(kMaxRowThreads, 1) depth_weights_kernel(DepthWeightsParams p) {
  extern __shared__ float logits[];  // [width], written by thread 0
  const int64_t t = blockIdx.x, T = p.num_tokens, d = p.d;
  const int first = p.has_null ? 1 : 0;
  const int sources = p.n + (p.partial ? 1 : 0);
  const int width = first + sources;
  const float* gate = p.source_gate_logits ? p.source_gate_logits + t * d : nullptr;
  for (int j = 0; j < sources; ++j) {
    const bool is_partial = j == p.n;
    const float* row =
        is_partial ? p.partial + t * d : p.bank + (static_cast<int64_t>(j) * T + t) * d;
    float acc[2] = {0.0f, 0.0f};  // query . row, row . row
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      float x = row[i];
      if (gate && !is_partial) x *= 1.0f / (1.0f + expf(-gate[i]));
      acc[0] += p.query[i] * x;
      acc[1] += x * x;
    }
    block_sum_n<2>(acc);
    if (threadIdx.x == 0) {
      logits[first + j] =
          acc[0] / sqrtf(acc[1] / static_cast<float>(d) + p.eps) + (is_partial ? p.bias : 0.0f);
    }
  }
  if (threadIdx.x != 0) return;
  if (p.has_null) logits[0] = p.null_logit;
  float big = logits[0];
  for (int j = 1; j < width; ++j) big = fmaxf(big, logits[j]);
  float sum = 0.0f;
  for (int j = 0; j < width; ++j) sum += (logits[j] = expf(logits[j] - big));
  const float inv = 1.0f / sum;
  float* w = p.out + t * width;
  for (int j = 0; j < width; ++j) w[j] = logits[j] * inv;
}

}  // namespace

void launch_depth_weights(const DepthWeightsParams& params, cudaStream_t stream) {
  if (params.num_tokens == 0) return;
  const int width = params.n + (params.has_null ? 1 : 0) + (params.partial ? 1 : 0);
  const size_t shared = static_cast<size_t>(width) * sizeof(float);
  depth_weights_kernel<<<static_cast<unsigned>(params.num_tokens), row_block_threads(params.d),
                         shared, stream>>>(params);
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
