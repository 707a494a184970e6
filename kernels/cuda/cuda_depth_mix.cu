// Depth attention (docs/ATTNRES.md §3), the two-phase form, on the GPU.
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
// the S online-softmax updates to its own elements of o. Where a thread owns at most two
// chunks of the row (one on the vector path: d <= 2048 at up to 256 threads; two on the
// scalar one: d <= 2048 at up to 1024 threads), o stays in its registers for the whole bank and the
// source chunk it loaded for the dots is reused: the bank is read once and o written once per
// group. Otherwise o is updated in memory after each entry, re-reading the row from L1/L2. The
// reduced logits are bitwise identical in every thread (xor-butterfly sums are symmetric), so the
// running m / s live in registers and the max branch is block-uniform. S is a template parameter
// (1..8, registers indexed by constants); more queries are done in groups of 8 by the launcher,
// like the CPU.
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
// The open-attnres switches (docs/ATTNRES.md §2d), mirroring kernels/cpu/cpu_depth_mix.cpp:
// Phase 1 may gate every source by sigmoid(gate logits[t]) (pre_gated; recomputed where the
// row is read, so nothing extra is stored); the general Phase 2 kernel drops the partial as
// a source, merges a null source with a constant logit, adds the partial to the mix and
// blends x and the mix with a scalar or per-element gate, in the same three passes. It also
// merges the newer bank entries (pushed after the group's Phase 1 ran, where the bank grows
// at every sublayer: full, delta, delta_v): their logits first, then their weighted rows.
// The bank may be F32 or BF16 (B, a template parameter): rows are widened in registers where
// they are read (Phase 1, the newer entries of Phase 2). Every row-wise loop reads V
// consecutive elements per thread (cuda_depth_rows.cuh): V = 8 with 16-byte loads when d is
// a multiple of 8 and every row pointer is 16-byte aligned (the launcher checks; the block
// then has d / 8 threads' worth of warps), else V = 1. A thread owns the same elements in
// every pass, so the aliasing and register arguments above hold for both.
#include <type_traits>

#include "kernels/cuda/cuda_activation.cuh"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_depth_rows.cuh"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_prenorm_rows.cuh"

namespace attnres::cuda {
namespace {

// C > 0: each thread owns at most C chunks of V elements (d <= C * V * blockDim), so its
// share of o for all S queries stays in registers across the whole bank and is stored once
// at the end, and each source chunk is loaded (and gated) once per entry. C == 0: any d; o
// is updated in memory after every entry (S * d floats read and written per entry, from
// L1/L2). Both apply the same operations in the same order, so they give the same bits.
template <int S, int V, class B, int C>
__global__ void __launch_bounds__(depth_block_threads<V>(), 1)
    depth_phase1_kernel(const float* __restrict__ queries, const B* __restrict__ bank, int n,
                        int64_t T, int64_t d, float eps, float* __restrict__ m,
                        float* __restrict__ s, float* __restrict__ o,
                        const float* __restrict__ gate_logits) {
  wait_for_previous_kernel();
  constexpr int kHeld = C > 0 ? C : 1;  // chunks whose source (and o) a thread keeps
  const int64_t t = blockIdx.x;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * V, stride = blockDim.x * V;
  const float* gate = gate_logits ? gate_logits + t * d : nullptr;
  float m_run[S], s_run[S];
  float o_acc[kHeld][S][V];  // C > 0: this thread's share of o
#pragma unroll
  for (int l = 0; l < S; ++l) m_run[l] = s_run[l] = 0.0f;
  for (int j = 0; j < n; ++j) {
    const B* row = bank + (static_cast<int64_t>(j) * T + t) * d;
    float acc[S + 1];
#pragma unroll
    for (int l = 0; l <= S; ++l) acc[l] = 0.0f;
    float held[kHeld][V];  // C > 0: the source chunks, kept for the update below
    auto add_dots = [&](const float(&x)[V], int64_t i) {
#pragma unroll
      for (int k = 0; k < V; ++k) acc[S] += x[k] * x[k];
#pragma unroll
      for (int l = 0; l < S; ++l) {
        float q[V];
        load_row<V>(queries + l * d, i, q);
#pragma unroll
        for (int k = 0; k < V; ++k) acc[l] += q[k] * x[k];
      }
    };
    if constexpr (C > 0) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int64_t i = first + c * stride;
        if (i < d) {
          load_source<V>(row, gate, i, held[c]);
          add_dots(held[c], i);
        }
      }
    } else {
      for (int64_t i = first; i < d; i += stride) {
        float x[V];
        load_source<V>(row, gate, i, x);
        add_dots(x, i);
      }
    }
    block_sum_n<S + 1>(acc);
    const float inv_rms = 1.0f / sqrtf(acc[S] / static_cast<float>(d) + eps);
#pragma unroll
    for (int l = 0; l < S; ++l) {
      float keep, w;
      phase1_online_step(j, acc[l] * inv_rms, m_run[l], s_run[l], keep, w);
      if constexpr (C > 0) {
#pragma unroll
        for (int c = 0; c < C; ++c) {
#pragma unroll
          for (int k = 0; k < V; ++k)
            o_acc[c][l][k] = j == 0 ? held[c][k] : o_acc[c][l][k] * keep + w * held[c][k];
        }
      } else {
        float* ol = o + (static_cast<int64_t>(l) * T + t) * d;
        for (int64_t i = first; i < d; i += stride) {
          float x[V], acc_o[V];
          load_source<V>(row, gate, i, x);
          if (j == 0) {
#pragma unroll
            for (int k = 0; k < V; ++k) acc_o[k] = x[k];
          } else {
            load_row<V>(ol, i, acc_o);
#pragma unroll
            for (int k = 0; k < V; ++k) acc_o[k] = acc_o[k] * keep + w * x[k];
          }
          store_row<V>(ol, i, acc_o);
        }
      }
    }
  }
  if constexpr (C > 0) {
#pragma unroll
    for (int l = 0; l < S; ++l) {
      float* ol = o + (static_cast<int64_t>(l) * T + t) * d;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int64_t i = first + c * stride;
        if (i < d) store_row<V>(ol, i, o_acc[c][l]);
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
// block_sum_n<2>: the same value in every thread. x is f32 (the partial) or a bank row.
template <int V, class R>
__device__ float block_row_logit(const float* __restrict__ query, const R* x, int64_t d,
                                 float eps) {
  float acc[2] = {0.0f, 0.0f};  // query . x, x . x
  for (int64_t i = static_cast<int64_t>(threadIdx.x) * V; i < d; i += blockDim.x * V) {
    float v[V], q[V];
    load_row<V>(x, i, v);
    load_row<V>(query, i, q);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      acc[0] += q[k] * v[k];
      acc[1] += v[k] * v[k];
    }
  }
  block_sum_n<2>(acc);
  return acc[0] / sqrtf(acc[1] / static_cast<float>(d) + eps);
}
// O float: pass 2 writes h into out, pass 3 scales it there (out may alias p). O uint16_t (bf16
// bits, the normed rows as a GEMM's input; out then apart from p): pass 3 computes h again
// from o and p, the same operations on the same operands, so the same f32 value is rounded.
template <class G, class O>
__global__ void __launch_bounds__(kMaxRowThreads, 1)
    depth_phase2_prenorm_kernel(const float* __restrict__ m, const float* __restrict__ s,
                                const float* __restrict__ o, const float* __restrict__ query,
                                float bias, float mix_eps, const float* p,
                                const G* __restrict__ gain, float norm_eps, int64_t d, O* out) {
  constexpr bool kF32Out = std::is_same_v<O, float>;
  wait_for_previous_kernel();
  const int64_t t = blockIdx.x;
  const float* pr = p + t * d;
  const float* orow = o + t * d;
  O* outr = out + t * d;

  // cuda_prenorm_rows.cuh's arithmetic: the GEMV's PreNorm prologue repeats it bit for bit.
  float acc[2];  // query . p, p . p
  phase2_logit_partials(query, pr, d, threadIdx.x, blockDim.x, acc[0], acc[1]);
  block_sum_n<2>(acc);
  const Phase2Weights w = phase2_weights(acc[0], acc[1], d, mix_eps, bias, m[t], s[t]);

  float hss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    const float h = phase2_mix(w, orow[i], pr[i]);
    if constexpr (kF32Out) outr[i] = h;
    hss = __fmaf_rn(h, h, hss);
  }
  const float inv_rms = prenorm_inv_rms(block_sum(hss), d, norm_eps);
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    if constexpr (kF32Out) {
      outr[i] = prenorm_scale(outr[i], inv_rms, to_f32(gain[i]));
    } else {
      store_activation(outr + i,
                       prenorm_scale(phase2_mix(w, orow[i], pr[i]), inv_rms, to_f32(gain[i])));
    }
  }
}

// Phase 2 with the §2d switches and newer bank entries, one block per token; see the header
// comment. Each newer entry's logit takes one block_sum_n<2> (dot, sum of squares); the
// reduced values are identical in every thread, so the weights live in registers. The loops
// over newer entries run to the constant kMaxNewerSources (unrolled, guarded by num_newer):
// indexed by a run-time k the two arrays went to a 64-byte local-memory frame instead
// (ptxas -v); the guard is block-uniform, so the barriers inside block_row_logit are safe.
// O float: h goes to out and is scaled there (out may alias the partial). O uint16_t (bf16 bits:
// the sublayer input as a GEMM's): h is staged in d floats of dynamic shared memory, each
// thread reading back only the elements it wrote, and out gets the scaled value rounded.
template <class G, int V, class B, class O>
__global__ void __launch_bounds__(depth_block_threads<V>(), 1)
    depth_phase2_general_kernel(DepthPhase2Params p) {
  extern __shared__ float staged_h[];  // [d] when O is not float
  wait_for_previous_kernel();
  const int64_t t = blockIdx.x, d = p.d, T = p.num_tokens;
  const int64_t first = static_cast<int64_t>(threadIdx.x) * V, stride = blockDim.x * V;
  const float* pr = p.partial + t * d;
  const float* orow = p.o + t * d;
  const float* gl = p.gate == 2 ? p.gate_logits + t * d : nullptr;
  const G* gain = static_cast<const G*>(p.gain);
  const B* newer = static_cast<const B*>(p.newer);
  O* outr = static_cast<O*>(p.out) + t * d;
  float* hrow;
  if constexpr (std::is_same_v<O, float>) {
    hrow = outr;
  } else {
    hrow = staged_h;
  }
  const float inv_d = 1.0f / static_cast<float>(d);
  auto newer_row = [&](int k) { return newer + (static_cast<int64_t>(k) * T + t) * d; };

  float big = p.m[t], q = 0.0f;
  float newer_logit[kMaxNewerSources];
#pragma unroll
  for (int k = 0; k < kMaxNewerSources; ++k) {
    if (k >= p.num_newer) break;
    newer_logit[k] = block_row_logit<V>(p.query, newer_row(k), d, p.mix_eps);
    big = fmaxf(big, newer_logit[k]);
  }
  if (p.partial_is_source) {
    q = block_row_logit<V>(p.query, pr, d, p.mix_eps) + p.bias;
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
  for (int64_t i = first; i < d; i += stride) {
    float x[V], hm[V];
    load_row<V>(pr, i, x);
    load_row<V>(orow, i, hm);
#pragma unroll
    for (int e = 0; e < V; ++e) hm[e] = wa * hm[e] + wb * x[e];
#pragma unroll
    for (int k = 0; k < kMaxNewerSources; ++k) {
      if (k < p.num_newer) {
        float v[V];
        load_row<V>(newer_row(k), i, v);
#pragma unroll
        for (int e = 0; e < V; ++e) hm[e] += newer_w[k] * v[e];
      }
    }
    if (p.null_source) {
      float v[V];
      load_row<V>(p.null_source, i, v);
#pragma unroll
      for (int e = 0; e < V; ++e) hm[e] += wc * v[e];
    }
    if (p.adds_partial) {
#pragma unroll
      for (int e = 0; e < V; ++e) hm[e] += x[e];
    }
    if (p.gate == 1) {
#pragma unroll
      for (int e = 0; e < V; ++e) hm[e] = x[e] + p.gate_blend * (hm[e] - x[e]);
    } else if (gl) {
      float g[V];
      load_row<V>(gl, i, g);
#pragma unroll
      for (int e = 0; e < V; ++e) hm[e] = x[e] + (hm[e] - x[e]) / (1.0f + expf(-g[e]));
    }
    store_row<V>(hrow, i, hm);  // h
#pragma unroll
    for (int e = 0; e < V; ++e) hss += hm[e] * hm[e];
  }
  hss = block_sum(hss);
  const float inv_rms = 1.0f / sqrtf(hss * inv_d + p.norm_eps);
  for (int64_t i = first; i < d; i += stride) {
    float h[V];
    load_row<V>(hrow, i, h);
#pragma unroll
    for (int e = 0; e < V; ++e) h[e] = h[e] * inv_rms * to_f32(gain[i + e]);
    store_row<V>(outr, i, h);
  }
}

struct Phase1Launch {
  const float* queries;  // this group's
  const void* bank;
  DType bank_dtype;
  int n;
  int64_t T, d;
  float eps;
  float *m, *s, *o;  // this group's
  const float* gate_logits;
  cudaStream_t stream;
};

template <int S, int V, class B, int C>
void launch_phase1_kernel(const Phase1Launch& a, const B* bank, int threads) {
  launch_kernel(depth_phase1_kernel<S, V, B, C>, dim3(static_cast<unsigned>(a.T)), dim3(threads), 0,
                a.stream, a.queries, bank, a.n, a.T, a.d, a.eps, a.m, a.s, a.o, a.gate_logits);
}

template <int S, int V, class B>
void launch_phase1_vector_width(const Phase1Launch& a, const B* bank) {
  const int threads = depth_row_threads(a.d, V > 1);
  const int held = phase1_held_chunks(a.d, V, threads);
  if (held == 1) {
    launch_phase1_kernel<S, V, B, 1>(a, bank, threads);
  } else if constexpr (V == 1) {
    if (held == 2) {
      launch_phase1_kernel<S, V, B, 2>(a, bank, threads);
    } else {
      launch_phase1_kernel<S, V, B, 0>(a, bank, threads);
    }
  } else {
    launch_phase1_kernel<S, V, B, 0>(a, bank, threads);
  }
}

template <int S>
void launch_phase1_group(const Phase1Launch& a) {
  const bool vec = rows_allow_vectors(a.d, {a.bank, a.queries, a.o, a.gate_logits});
  dispatch_bank_dtype(a.bank_dtype, "depth_phase1 bank", [&](auto tag) {
    using B = decltype(tag);
    const B* bank = static_cast<const B*>(a.bank);
    if (vec) {
      launch_phase1_vector_width<S, kDepthVector, B>(a, bank);
    } else {
      launch_phase1_vector_width<S, 1, B>(a, bank);
    }
  });
}

}  // namespace

void launch_depth_phase1(const float* queries, int num_queries, const void* bank, DType bank_dtype,
                         int n, int64_t num_tokens, int64_t d, float eps, float* m, float* s,
                         float* o, const float* source_gate_logits, cudaStream_t stream) {
  if (num_tokens == 0 || num_queries == 0) return;
  const int64_t T = num_tokens;
  for (int l0 = 0; l0 < num_queries; l0 += kMaxFusedQueries) {
    const int group = num_queries - l0 < kMaxFusedQueries ? num_queries - l0 : kMaxFusedQueries;
    const Phase1Launch a{queries + static_cast<int64_t>(l0) * d,
                         bank,
                         bank_dtype,
                         n,
                         T,
                         d,
                         eps,
                         m + static_cast<int64_t>(l0) * T,
                         s + static_cast<int64_t>(l0) * T,
                         o + static_cast<int64_t>(l0) * T * d,
                         source_gate_logits,
                         stream};
    dispatch_phase1_queries(group, [&](auto q) { launch_phase1_group<decltype(q)::value>(a); });
    CUDA_CHECK_LAUNCH();
  }
}

void launch_depth_phase2_prenorm(const float* m, const float* s, const float* o, const float* query,
                                 float bias, float mix_eps, const float* partial, const void* gain,
                                 DType gain_dtype, float norm_eps, int64_t num_tokens, int64_t d,
                                 void* out, DType out_dtype, cudaStream_t stream) {
  if (num_tokens == 0 || d == 0) return;
  dispatch_float_dtype(gain_dtype, "depth_phase2 prenorm gain", [&](auto tag) {
    using G = decltype(tag);
    dispatch_activation_dtype(out_dtype, "depth_phase2 out", [&](auto out_tag) {
      using O = decltype(out_tag);
      launch_kernel(depth_phase2_prenorm_kernel<G, O>, static_cast<unsigned>(num_tokens),
                    row_block_threads(d), 0, stream, m, s, o, query, bias, mix_eps, partial,
                    static_cast<const G*>(gain), norm_eps, d, static_cast<O*>(out));
    });
  });
  CUDA_CHECK_LAUNCH();
}

void launch_depth_phase2_general(const DepthPhase2Params& params, cudaStream_t stream) {
  if (params.num_tokens == 0 || params.d == 0) return;
  const int64_t d = params.d;
  const bool vec = rows_allow_vectors(d, {params.o, params.query, params.newer, params.null_source,
                                          params.gate_logits, params.partial, params.out});
  const unsigned grid = static_cast<unsigned>(params.num_tokens);
  // Without newer entries the bank dtype is irrelevant: F32 keeps to one instantiation.
  const DType bank_dtype = params.newer ? params.newer_dtype : DType::F32;
  const bool staged = params.out_dtype != DType::F32;
  ATTNRES_CHECK(!staged || d <= kMaxPhase2StagedBf16Row,
                "depth_phase2: a bf16 out of rows of " + std::to_string(d) +
                    " elements does not fit the shared-memory staging (at most " +
                    std::to_string(kMaxPhase2StagedBf16Row) + ")");
  const size_t shared_bytes = staged ? static_cast<size_t>(d) * sizeof(float) : 0;
  dispatch_float_dtype(params.gain_dtype, "depth_phase2 prenorm gain", [&](auto gain_tag) {
    using G = decltype(gain_tag);
    dispatch_bank_dtype(bank_dtype, "depth_phase2 newer entries", [&](auto bank_tag) {
      using B = decltype(bank_tag);
      dispatch_activation_dtype(params.out_dtype, "depth_phase2 out", [&](auto out_tag) {
        using O = decltype(out_tag);
        if (vec) {
          launch_kernel(depth_phase2_general_kernel<G, kDepthVector, B, O>, grid,
                        depth_row_threads(d, true), shared_bytes, stream, params);
        } else {
          launch_kernel(depth_phase2_general_kernel<G, 1, B, O>, grid, depth_row_threads(d, false),
                        shared_bytes, stream, params);
        }
      });
    });
  });
  CUDA_CHECK_LAUNCH();
}

}  // namespace attnres::cuda
