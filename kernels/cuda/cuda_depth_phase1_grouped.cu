// Phase 1 of depth attention with its bank entries read in groups: the lever
// ATTNRES_CUDA_PHASE1_GROUPED (kernels/cuda/NOTES.md "GEMV levers").
//
// depth_phase1_kernel (cuda_depth_mix.cu) walks the bank one entry at a time: load the row,
// S + 1 partial sums, one block_sum_n<S + 1> (a barrier pair), the S online-softmax updates,
// then the next entry. At decode sizes (one block per token, 128 threads at d = 1024) each
// entry is a load latency plus a reduction, one after the other. This kernel loads G entries'
// chunks before it reduces any, reduces their G * (S + 1) sums in one block_sum_n, then applies
// the G entries' updates in order: a load latency and a barrier pair per G entries.
//
// Bits: block_sum_n reduces each value on its own with the same tree whatever N is, every
// partial sum gets the same products in the same order as depth_phase1_kernel's add_dots, and
// the updates run per entry in bank order with the same operations, so m, s and o are
// depth_phase1_kernel's bits. Only the case where a thread owns one chunk of the row
// (depth_phase1_kernel's C == 1: d <= 2048 on the vector path, d <= 1024 on the scalar one) is
// taken; the launcher declines the rest and the op runs depth_phase1_kernel.
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_depth_rows.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

// Entries per group for S queries read V at a time: as many as the registers hold without
// spilling (the vector path's blocks have at most 256 threads, so 255 registers; the scalar
// path's up to 1024, so 64). Checked with -Xptxas -v (kernels/cuda/NOTES.md).
template <int S, int V>
constexpr int phase1_entry_group() {
  if constexpr (V == 1) return S <= 4 ? 4 : 2;
  return S <= 4 ? 8 : 4;
}

template <int S, int V, class B, int G>
__global__ void __launch_bounds__(depth_block_threads<V>(), 1)
    depth_phase1_grouped_kernel(const float* __restrict__ queries, const B* __restrict__ bank,
                                int n, int64_t T, int64_t d, float eps, float* __restrict__ m,
                                float* __restrict__ s, float* __restrict__ o,
                                const float* __restrict__ gate_logits) {
  wait_for_previous_kernel();
  constexpr int kSums = S + 1;  // per entry: the S dot products, then the sum of squares
  const int64_t t = blockIdx.x;
  const int64_t i = static_cast<int64_t>(threadIdx.x) * V;  // the one chunk this thread owns
  const bool owns = i < d;
  const float* gate = gate_logits ? gate_logits + t * d : nullptr;
  float m_run[S], s_run[S];
  float o_acc[S][V];  // this thread's share of o
#pragma unroll
  for (int l = 0; l < S; ++l) m_run[l] = s_run[l] = 0.0f;
  for (int j0 = 0; j0 < n; j0 += G) {
    float held[G][V];  // the G entries' source chunks, kept for the updates
    float acc[G * kSums];
#pragma unroll
    for (int e = 0; e < G * kSums; ++e) acc[e] = 0.0f;
    if (owns) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (j0 + g < n)
          load_source<V>(bank + (static_cast<int64_t>(j0 + g) * T + t) * d, gate, i, held[g]);
      }
      // depth_phase1_kernel's add_dots for each entry: the sum of squares, then each query's
      // dot, every accumulator fed its V products in the order k = 0 .. V - 1.
#pragma unroll
      for (int g = 0; g < G; ++g) {
        if (j0 + g < n) {
#pragma unroll
          for (int k = 0; k < V; ++k) acc[g * kSums + S] += held[g][k] * held[g][k];
        }
      }
#pragma unroll
      for (int l = 0; l < S; ++l) {
        float q[V];
        load_row<V>(queries + l * d, i, q);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          if (j0 + g < n) {
#pragma unroll
            for (int k = 0; k < V; ++k) acc[g * kSums + l] += q[k] * held[g][k];
          }
        }
      }
    }
    block_sum_n<G * kSums>(acc);
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const int j = j0 + g;
      if (j >= n) break;
      const float inv_rms = 1.0f / sqrtf(acc[g * kSums + S] / static_cast<float>(d) + eps);
#pragma unroll
      for (int l = 0; l < S; ++l) {
        float keep, w;
        phase1_online_step(j, acc[g * kSums + l] * inv_rms, m_run[l], s_run[l], keep, w);
#pragma unroll
        for (int k = 0; k < V; ++k)
          o_acc[l][k] = j == 0 ? held[g][k] : o_acc[l][k] * keep + w * held[g][k];
      }
    }
  }
  if (owns) {
#pragma unroll
    for (int l = 0; l < S; ++l) store_row<V>(o + (static_cast<int64_t>(l) * T + t) * d, i, o_acc[l]);
  }
  if (threadIdx.x == 0) {
#pragma unroll
    for (int l = 0; l < S; ++l) {
      m[l * T + t] = m_run[l];
      s[l * T + t] = s_run[l];
    }
  }
}

template <int S, int V, class B>
void launch_grouped(const float* queries, const B* bank, int n, int64_t T, int64_t d, float eps,
                    float* m, float* s, float* o, const float* gate, int threads,
                    cudaStream_t stream) {
  launch_kernel(depth_phase1_grouped_kernel<S, V, B, phase1_entry_group<S, V>()>,
                dim3(static_cast<unsigned>(T)), dim3(threads), 0, stream, queries, bank, n, T, d,
                eps, m, s, o, gate);
}

}  // namespace

bool launch_depth_phase1_grouped(const float* queries, int num_queries, const void* bank,
                                 DType bank_dtype, int n, int64_t num_tokens, int64_t d, float eps,
                                 float* m, float* s, float* o, const float* source_gate_logits,
                                 cudaStream_t stream) {
  // Every query group's pointers are offsets of multiples of d elements from these, so one
  // check of the bases decides the vector width of every launch below.
  const bool vec = rows_allow_vectors(d, {bank, queries, o, source_gate_logits});
  const int V = vec ? kDepthVector : 1;
  const int threads = depth_row_threads(d, vec);
  if (phase1_held_chunks(d, V, threads) != 1) return false;
  if (num_tokens == 0 || num_queries == 0) return true;
  const int64_t T = num_tokens;
  for (int l0 = 0; l0 < num_queries; l0 += kMaxFusedQueries) {
    const int group = num_queries - l0 < kMaxFusedQueries ? num_queries - l0 : kMaxFusedQueries;
    const float* q = queries + static_cast<int64_t>(l0) * d;
    float* mg = m + static_cast<int64_t>(l0) * T;
    float* sg = s + static_cast<int64_t>(l0) * T;
    float* og = o + static_cast<int64_t>(l0) * T * d;
    dispatch_phase1_queries(group, [&](auto queries_tag) {
      constexpr int S = decltype(queries_tag)::value;
      dispatch_bank_dtype(bank_dtype, "depth_phase1 bank", [&](auto bank_tag) {
        using B = decltype(bank_tag);
        const B* b = static_cast<const B*>(bank);
        if (vec) {
          launch_grouped<S, kDepthVector, B>(q, b, n, T, d, eps, mg, sg, og, source_gate_logits,
                                             threads, stream);
        } else {
          launch_grouped<S, 1, B>(q, b, n, T, d, eps, mg, sg, og, source_gate_logits, threads,
                                  stream);
        }
      });
    });
    CUDA_CHECK_LAUNCH();
  }
  return true;
}

}  // namespace attnres::cuda
