// Depth attention (ATTNRES.md §3), the two-phase form, on the GPU.
//
// Phase 1 (once per block of layers, for the S sublayers that read the same bank), per
// token t:
//   logit[l, j] = queries[l] . bank[j, t] / rms(bank[j, t])      rms(x) = sqrt(mean(x^2) + eps)
//   m[l, t] = max_j logit,  s[l, t] = sum_j e^(logit - m),  o[l, t] = sum_j e^(logit - m) bank[j,
//   t]
// Layout: queries [S, d], bank [>= n, T, d] (first n live), m, s [S, T], o [S, T, d], f32.
// One block per token (d up to 8192: up to 1024 threads, each owning the elements
// i = tid, tid + blockDim, ...). For each bank entry j the block makes ONE pass over the row
// computing the sum of squares and the S dot products together, reduced with a single
// block_sum_n<S + 1> (one pair of barriers for all S + 1 values); then every thread applies
// the S online-softmax updates to its own elements of o (re-reading the row from L1/L2).
// The reduced logits are bitwise identical in every thread (xor-butterfly sums are
// symmetric), so the running m / s live in registers and the max branch is block-uniform.
// S is a template parameter (1..8, registers indexed by constants); more queries are done
// in groups of 8 by the launcher, like the CPU.
//
// Phase 2 fused with the sublayer's PreNorm, per token (p = partial row, m / s / o this
// sublayer's Phase-1 rows): ONE kernel, one block per token:
//   q = query . p / rms(p) + bias;  M = max(m, q);  a = e^(m - M), b = e^(q - M)
//   h = (a o + b p) / (a s + b);   out = h / rms(h) * prenorm_gain
// Pass 1 reads p (dot + sum of squares, one block_sum_n<2>), pass 2 writes h into out while
// summing h^2, pass 3 scales out in place. A thread only writes elements it read itself, and
// pass 1's reads of p are behind the reduction barrier, so out may alias p. The no-mix
// case (plain pre-norm model, or an empty bank) is launch_rms_norm, called by the op.
//
// The open-attnres switches (ATTNRES.md §2d), mirroring kernels/cpu/cpu_depth_mix.cpp:
// Phase 1 may gate every source by sigmoid(gate logits[t]) (pre_gated; recomputed where the
// row is read, so nothing extra is stored); the general Phase 2 kernel drops the partial as
// a source, merges a null source with a constant logit, adds the partial to the mix and
// blends x and the mix with a scalar or per-element gate, in the same three passes. It also
// merges the newer bank entries (pushed after the group's Phase 1 ran, where the bank grows
// at every sublayer: full, delta, delta_v): their logits first, then their weighted rows.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

constexpr int kMaxFusedQueries = 8;

template <int S>
__global__ void __launch_bounds__(kMaxRowThreads, 1)
    depth_phase1_kernel(const float* __restrict__ queries, const float* __restrict__ bank, int n,
                        int64_t T, int64_t d, float eps, float* __restrict__ m,
                        float* __restrict__ s, float* __restrict__ o,
                        const float* __restrict__ gate_logits) {
  const int64_t t = blockIdx.x;
  const float* gate = gate_logits ? gate_logits + t * d : nullptr;
  // The source value at element i: the bank row, gated under pre_gated.
  auto source = [gate](const float* row, int64_t i) {
    return gate ? row[i] / (1.0f + expf(-gate[i])) : row[i];
  };
  float m_run[S], s_run[S];
#pragma unroll
  for (int l = 0; l < S; ++l) m_run[l] = s_run[l] = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float* row = bank + (static_cast<int64_t>(j) * T + t) * d;
    float acc[S + 1];
#pragma unroll
    for (int l = 0; l <= S; ++l) acc[l] = 0.0f;
    for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
      const float x = source(row, i);
      acc[S] += x * x;
#pragma unroll
      for (int l = 0; l < S; ++l) acc[l] += queries[l * d + i] * x;
    }
    block_sum_n<S + 1>(acc);
    const float inv_rms = 1.0f / sqrtf(acc[S] / static_cast<float>(d) + eps);
#pragma unroll
    for (int l = 0; l < S; ++l) {
      const float logit = acc[l] * inv_rms;
      float* ol = o + (static_cast<int64_t>(l) * T + t) * d;
      if (j == 0) {
        m_run[l] = logit;
        s_run[l] = 1.0f;
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ol[i] = source(row, i);
      } else if (logit > m_run[l]) {  // new max: rescale what was accumulated
        const float c = expf(m_run[l] - logit);
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ol[i] = ol[i] * c + source(row, i);
        s_run[l] = s_run[l] * c + 1.0f;
        m_run[l] = logit;
      } else {
        const float w = expf(logit - m_run[l]);
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) ol[i] = ol[i] + w * source(row, i);
        s_run[l] += w;
      }
    }
  }
  if (threadIdx.x == 0) {
#pragma unroll
    for (int l = 0; l < S; ++l) {
      m[l * T + t] = m_run[l];
      s[l * T + t] = s_run[l];
    }
  }
}

// query . x / rms(x) over one row (rms with eps), reduced over the block with one
// block_sum_n<2>: the same value in every thread.
__device__ float block_row_logit(const float* __restrict__ query, const float* x, int64_t d,
                                 float eps) {
  float acc[2] = {0.0f, 0.0f};  // query . x, x . x
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = x[i];
    acc[0] += query[i] * v;
    acc[1] += v * v;
  }
  block_sum_n<2>(acc);
  return acc[0] / sqrtf(acc[1] / static_cast<float>(d) + eps);
}

template <class G>
__global__ void __launch_bounds__(kMaxRowThreads, 1)
    depth_phase2_prenorm_kernel(const float* __restrict__ m, const float* __restrict__ s,
                                const float* __restrict__ o, const float* __restrict__ query,
                                float bias, float mix_eps, const float* p,
                                const G* __restrict__ gain, float norm_eps, int64_t d, float* out) {
  const int64_t t = blockIdx.x;
  const float* pr = p + t * d;
  const float* orow = o + t * d;
  float* outr = out + t * d;
  const float inv_d = 1.0f / static_cast<float>(d);

  const float q = block_row_logit(query, pr, d, mix_eps) + bias;
  const float mt = m[t];
  const float big = fmaxf(mt, q);
  const float a = expf(mt - big), b = expf(q - big);
  const float inv_den = 1.0f / (a * s[t] + b);
  const float wa = a * inv_den, wb = b * inv_den;

  float hss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float h = wa * orow[i] + wb * pr[i];
    outr[i] = h;
    hss += h * h;
  }
  hss = block_sum(hss);
  const float inv_rms = 1.0f / sqrtf(hss * inv_d + norm_eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    outr[i] = outr[i] * inv_rms * to_f32(gain[i]);
}

// Phase 2 with the §2d switches and newer bank entries, one block per token; see the header
// comment. Each newer entry's logit takes one block_sum_n<2> (dot, sum of squares); the
// reduced values are identical in every thread, so the weights live in registers. The loops
// over newer entries run to the constant kMaxNewerSources (unrolled, guarded by num_newer):
// indexed by a run-time k the two arrays went to a 64-byte local-memory frame instead
// (ptxas -v); the guard is block-uniform, so the barriers inside block_row_logit are safe.
template <class G>
__global__ void __launch_bounds__(kMaxRowThreads, 1)
    depth_phase2_general_kernel(DepthPhase2Params p) {
  const int64_t t = blockIdx.x, d = p.d, T = p.num_tokens;
  const float* pr = p.partial + t * d;
  const float* orow = p.o + t * d;
  const float* gl = p.gate == 2 ? p.gate_logits + t * d : nullptr;
  const G* gain = static_cast<const G*>(p.gain);
  float* outr = p.out + t * d;
  const float inv_d = 1.0f / static_cast<float>(d);
  auto newer_row = [&](int k) { return p.newer + (static_cast<int64_t>(k) * T + t) * d; };

  float big = p.m[t], q = 0.0f;
  float newer_logit[kMaxNewerSources];
#pragma unroll
  for (int k = 0; k < kMaxNewerSources; ++k) {
    if (k >= p.num_newer) break;
    newer_logit[k] = block_row_logit(p.query, newer_row(k), d, p.mix_eps);
    big = fmaxf(big, newer_logit[k]);
  }
  if (p.partial_is_source) {
    q = block_row_logit(p.query, pr, d, p.mix_eps) + p.bias;
    big = fmaxf(big, q);
  }
  if (p.null_source) big = fmaxf(big, p.null_logit);
  const float a = expf(p.m[t] - big);
  const float b = p.partial_is_source ? expf(q - big) : 0.0f;
  const float c = p.null_source ? expf(p.null_logit - big) : 0.0f;
  float den = a * p.s[t] + b + c;
  float newer_w[kMaxNewerSources];
#pragma unroll
  for (int k = 0; k < kMaxNewerSources; ++k)
    if (k < p.num_newer) den += (newer_w[k] = expf(newer_logit[k] - big));
  const float inv_den = 1.0f / den;
  const float wa = a * inv_den, wb = b * inv_den, wc = c * inv_den;
#pragma unroll
  for (int k = 0; k < kMaxNewerSources; ++k)
    if (k < p.num_newer) newer_w[k] *= inv_den;

  float hss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float x = pr[i];
    float hm = wa * orow[i] + wb * x;
#pragma unroll
    for (int k = 0; k < kMaxNewerSources; ++k)
      if (k < p.num_newer) hm += newer_w[k] * newer_row(k)[i];
    if (p.null_source) hm += wc * p.null_source[i];
    if (p.adds_partial) hm += x;
    float h = hm;
    if (p.gate == 1) {
      h = x + p.gate_blend * (hm - x);
    } else if (gl) {
      h = x + (hm - x) / (1.0f + expf(-gl[i]));
    }
    outr[i] = h;
    hss += h * h;
  }
  hss = block_sum(hss);
  const float inv_rms = 1.0f / sqrtf(hss * inv_d + p.norm_eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
    outr[i] = outr[i] * inv_rms * to_f32(gain[i]);
}

template <int S>
void launch_phase1_group(const float* queries, const float* bank, int n, int64_t T, int64_t d,
                         float eps, float* m, float* s, float* o, const float* gate_logits,
                         cudaStream_t stream) {
  depth_phase1_kernel<S><<<static_cast<unsigned>(T), row_block_threads(d), 0, stream>>>(
      queries, bank, n, T, d, eps, m, s, o, gate_logits);
}

}  // namespace

void launch_depth_phase1(const float* queries, int num_queries, const float* bank, int n,
                         int64_t num_tokens, int64_t d, float eps, float* m, float* s, float* o,
                         const float* source_gate_logits, cudaStream_t stream) {
  if (num_tokens == 0 || num_queries == 0) return;
  const int64_t T = num_tokens;
  for (int l0 = 0; l0 < num_queries; l0 += kMaxFusedQueries) {
    const int group = num_queries - l0 < kMaxFusedQueries ? num_queries - l0 : kMaxFusedQueries;
    const float* qg = queries + static_cast<int64_t>(l0) * d;
    float* mg = m + static_cast<int64_t>(l0) * T;
    float* sg = s + static_cast<int64_t>(l0) * T;
    float* og = o + static_cast<int64_t>(l0) * T * d;
    switch (group) {
      case 1:
        launch_phase1_group<1>(qg, bank, n, T, d, eps, mg, sg, og, source_gate_logits, stream);
        break;
      case 2:
        launch_phase1_group<2>(qg, bank, n, T, d, eps, mg, sg, og, source_gate_logits, stream);
        break;
      case 3:
        launch_phase1_group<3>(qg, bank, n, T, d, eps, mg, sg, og, source_gate_logits, stream);
        break;
      case 4:
        launch_phase1_group<4>(qg, bank, n, T, d, eps, mg, sg, og, source_gate_logits, stream);
        break;
      case 5:
        launch_phase1_group<5>(qg, bank, n, T, d, eps, mg, sg, og, source_gate_logits, stream);
        break;
      case 6:
        launch_phase1_group<6>(qg, bank, n, T, d, eps, mg, sg, og, source_gate_logits, stream);
        break;
      case 7:
        launch_phase1_group<7>(qg, bank, n, T, d, eps, mg, sg, og, source_gate_logits, stream);
        break;
      default:
        launch_phase1_group<8>(qg, bank, n, T, d, eps, mg, sg, og, source_gate_logits, stream);
        break;
    }
    CUDA_CHECK_LAUNCH();
  }
}

void launch_depth_phase2_prenorm(const float* m, const float* s, const float* o, const float* query,
                                 float bias, float mix_eps, const float* partial, const void* gain,
                                 DType gain_dtype, float norm_eps, int64_t num_tokens, int64_t d,
                                 float* out, cudaStream_t stream) {
  if (num_tokens == 0 || d == 0) return;
  dispatch_float_dtype(gain_dtype, "depth_phase2 prenorm gain", [&](auto tag) {
    using G = decltype(tag);
    depth_phase2_prenorm_kernel<G>
        <<<static_cast<unsigned>(num_tokens), row_block_threads(d), 0, stream>>>(
            m, s, o, query, bias, mix_eps, partial, static_cast<const G*>(gain), norm_eps, d, out);
  });
  CUDA_CHECK_LAUNCH();
}

void launch_depth_phase2_general(const DepthPhase2Params& params, cudaStream_t stream) {
  if (params.num_tokens == 0 || params.d == 0) return;
  dispatch_float_dtype(params.gain_dtype, "depth_phase2 prenorm gain", [&](auto tag) {
    using G = decltype(tag);
    depth_phase2_general_kernel<G>
        <<<static_cast<unsigned>(params.num_tokens), row_block_threads(params.d), 0, stream>>>(
            params);
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
