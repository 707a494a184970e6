// Depth-attention weights of one mixing step, for introspection (docs/ATTNRES.md §5), per token t:
//   logit_j = query . src_j / rms(src_j)  (+ bias on the partial)  rms(x) = sqrt(mean(x^2) + eps)
//   out[t, j] = softmax_j(logit)
// over [null source (constant logit)?] + bank[0, n) + [partial?] (docs/ATTNRES.md §2d); under
// pre_gated each bank source is sigmoid(gate logits[t]) * bank[j, t] first.
// Layout: query [d], bank [>= n, T, d] (first n live; F32 or BF16, widened when read),
// partial [T, d], out [T, width], f32. Rows are read 8 elements per thread with 16-byte loads
// when d and the pointers allow (cuda_depth_rows.cuh), else one at a time.
// One block per token. For each source the block makes one pass over the row computing the
// dot product and the sum of squares together (one block_sum_n<2>), exactly like Phase 1's
// logits; thread 0 keeps the n + 1 logits in dynamic shared memory and, after the last one,
// writes the max-subtracted softmax. The forward runs this only when a request asked for the
// weights, so the serial softmax over n + 1 values (a few dozen at most) is not worth more.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_depth_rows.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

// acc = {query . src, src . src} over this thread's elements of a row (f32 partial or bank
// row), src gated by sigmoid(gate) when gate is non-null.
template <int V, class R>
__device__ __forceinline__ void row_dot_and_squares(const float* query, const R* row,
                                                    const float* gate, int64_t d, float (&acc)[2]) {
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * V; i < d; i += blockDim.x * V) {
    float x[V], q[V];
    load_row<V>(row, i, x);
    load_row<V>(query, i, q);
    if (gate) {
      float g[V];
      load_row<V>(gate, i, g);
#pragma unroll
      for (int k = 0; k < V; ++k) x[k] *= 1.0f / (1.0f + expf(-g[k]));
    }
#pragma unroll
    for (int k = 0; k < V; ++k) {
      acc[0] += q[k] * x[k];
      acc[1] += x[k] * x[k];
    }
  }
}

template <int V, class B>
__global__ void __launch_bounds__(depth_block_threads<V>(), 1)
    depth_weights_kernel(DepthWeightsParams p) {
  wait_for_previous_kernel();
  extern __shared__ float logits[];  // [width], written by thread 0
  const int64_t t = blockIdx.x, T = p.num_tokens, d = p.d;
  const int first = p.has_null ? 1 : 0;
  const int sources = p.n + (p.partial ? 1 : 0);
  const int width = first + sources;
  const float* gate = p.source_gate_logits ? p.source_gate_logits + t * d : nullptr;
  const B* bank = static_cast<const B*>(p.bank);
  for (int j = 0; j < sources; ++j) {
    const bool is_partial = j == p.n;
    float acc[2] = {0.0f, 0.0f};  // query . row, row . row
    if (is_partial) {
      row_dot_and_squares<V>(p.query, p.partial + t * d, nullptr, d, acc);
    } else {
      row_dot_and_squares<V>(p.query, bank + (static_cast<int64_t>(j) * T + t) * d, gate, d, acc);
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
  const int64_t d = params.d;
  const bool vec =
      rows_allow_vectors(d, {params.query, params.bank, params.partial, params.source_gate_logits});
  const unsigned grid = static_cast<unsigned>(params.num_tokens);
  dispatch_bank_dtype(params.bank_dtype, "depth_weights bank", [&](auto tag) {
    using B = decltype(tag);
    if (vec) {
      launch_kernel(depth_weights_kernel<kDepthVector, B>, grid, depth_row_threads(d, true), shared,
                    stream, params);
    } else {
      launch_kernel(depth_weights_kernel<1, B>, grid, depth_row_threads(d, false), shared, stream,
                    params);
    }
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
