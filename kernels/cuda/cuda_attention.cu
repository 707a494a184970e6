// store_kv and causal GQA attention over the paged KV cache (flash-decoding).
//
// Cache layout (per layer): K, V [num_blocks, block_size, Hkv, hd], F32 or BF16. Position p
// of sequence s lives in physical block block_table[s][p / block_size] at offset
// p % block_size, i.e. cache row slot = block * block_size + offset, of Hkv * hd values. The
// block table arrives from prepare_batch as a padded [num_seqs, max_blocks] matrix;
// seq_of_token[t] says which row token t reads. Query token t attends to positions
// 0..positions[t] of its sequence, whether it is a decode row or one of a prefill chunk.
//
// store_kv: one block per token converting its K and V rows into row slot_mapping[t]; a bf16
// cache rounds to nearest even with the CPU's integer formula (f32_to_bf16), so a stored
// value is bit for bit the CPU's.
//
// attention (flash-decoding) for the rows cuda_attention_dispatch.h gives it: decode rows and
// short chunks, or every row where the tensor-core prefill kernel (cuda_prefill_attention.cu)
// does not take the shape; a row list maps the launch's rows to tokens. Split three ways:
// - GQA: a CTA serves one KV head and up to 8 of its query heads (attention_heads_per_cta),
//   so each K / V byte is read once per group, not once per query head.
// - split-K (flash-decoding): the CTAs of a (token, KV head) each take a contiguous split of
//   the context (plan_attention_splits: enough CTAs to fill the SMs several times; at batch 1
//   one (token, head) would otherwise be a single CTA walking the whole context).
// - within a CTA: 4 warps; a key is read by a group of L lanes (L = the 16-byte vectors of a
//   row rounded up to a power of two, at most 32), lane j of the group holding elements
//   [j * V, j * V + V) of q, K and V (V = 8 bf16 or 4 f32 per 16-byte load; 1 when hd is not a
//   multiple of V), so a warp reads 32 / L keys at once. Each key group keeps its own online
//   softmax state per query head (running max m, sum l, output acc):
//     score = group_sum(q . k) * scale;  m' = max(m, score);  c = e^(m - m');
//     w = e^(score - m');  l = l c + w;  acc = acc c + w v
//   Then the key groups of a warp merge by xor butterfly (both partners compute the same
//   sum with the operands swapped: IEEE addition commutes, so no order question), and the 4
//   warps merge through shared memory in warp order.
// - a split's (m, l, acc) goes to scratch; a merge kernel combines a token's splits in split
//   order. A token whose context fits in one split is written directly. Under the last-block
//   merge lever (cuda_attention_merge.h) there is no merge kernel: each split CTA counts
//   itself in on a counter of its (row, grid column) once its partials are stored, and the
//   CTA that counts last merges the splits of its query heads with the merge kernel's code
//   (which CTA that is does not matter: it reads every split from scratch in split order),
//   then sets the counter back to 0 for the next launch or graph replay.
// Every reduction has a fixed order (the counter decides only who merges): the same batch
// gives the same bits. A token's result depends on the split length, which the plan takes from
// the batch's longest context and its size: deterministic, not batch-invariant (NOTES.md
// "Batch invariance").
// All in f32 with expf (not __expf), to track the CPU's two-pass softmax to ~1e-6 relative.
#include <algorithm>
#include <type_traits>

#include "kernels/cuda/cuda_activation.cuh"
#include "kernels/cuda/cuda_attention_merge.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

constexpr int kStoreThreads = 256;
constexpr int kAttentionWarps = 4;
constexpr int kAttentionThreads = kAttentionWarps * 32;
constexpr int kMaxHeadsPerCta = 8;
constexpr int kMergeThreads = 256;  // >= kMaxAttentionHeadDim: one thread per output element
// CTAs the plan aims for per SM (4 warps each): enough 16-byte loads in flight to approach
// the memory bandwidth.
constexpr int kCtasPerSm = 4;

// --- storage: f32 as float, bf16 as its 16 bits ---

// f32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN with its sign and top
// payload bits. The CPU's f32_to_bf16 (engine/core/dtype.h) line for line: __float2bfloat16_rn
// would canonicalise NaNs and so differ from the CPU oracle.
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  const uint32_t bits = __float_as_uint(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}

__device__ __forceinline__ void store_converted(float* dst, float x) { *dst = x; }
__device__ __forceinline__ void store_converted(uint16_t* dst, float x) {
  *dst = f32_to_bf16_bits(x);
}

// N consecutive stored values at p, widened to f32: one 16-byte load (N = 4 f32 or 8 bf16;
// p 16-byte aligned) or one scalar (N = 1).
template <class S, int N>
__device__ __forceinline__ void load_widened(const S* p, float (&x)[N]) {
  if constexpr (N == 1) {
    x[0] = widen(*p);
  } else if constexpr (std::is_same_v<S, float>) {
    static_assert(N == 4, "f32: 4 per 16-byte load");
    const float4 v = __ldg(reinterpret_cast<const float4*>(p));
    x[0] = v.x;
    x[1] = v.y;
    x[2] = v.z;
    x[3] = v.w;
  } else {
    static_assert(N == 8, "bf16: 8 per 16-byte load");
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // little endian: the low half is the earlier element
      x[2 * i] = __uint_as_float(words[i] << 16);
      x[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
}

template <class S>
__global__ void __launch_bounds__(kStoreThreads, 1)
    store_kv_kernel(const float* __restrict__ k, const float* __restrict__ v,
                    const int32_t* __restrict__ slots, int64_t row_elems, S* __restrict__ k_cache,
                    S* __restrict__ v_cache) {
  wait_for_previous_kernel();
  const int64_t t = blockIdx.x;
  const int64_t dst = static_cast<int64_t>(slots[t]) * row_elems;
  const int64_t src = t * row_elems;
  for (int64_t i = threadIdx.x; i < row_elems; i += blockDim.x) {
    store_converted(k_cache + dst + i, k[src + i]);
    store_converted(v_cache + dst + i, v[src + i]);
  }
}

// --- attention ---

// Sum over the L lanes of a key group (L a power of two <= 32, the same for the whole warp;
// every lane of the warp must call it).
__device__ __forceinline__ float key_group_sum(float v, int lanes_per_key) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    if (offset < lanes_per_key) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// e^(m - max) for a softmax state's running max m; 0 for a state that saw no key (m = -inf,
// where max may be -inf too and the difference NaN).
__device__ __forceinline__ float rescale(float m, float max) {
  return m == -INFINITY ? 0.0f : expf(m - max);
}

// Splits token t uses: ceil(context / split_len), at most num_splits (the last split runs to
// the end of the context).
__device__ __forceinline__ int splits_of(int context, int split_len, int num_splits) {
  return min((context + split_len - 1) / split_len, num_splits);
}

// --- the split merge, shared by merge_attention_splits_kernel and the last-block merge ---
// partials: [rows * hq, num_splits] records of hd accs, then a (m, l) pair per record (ml).
// One code for both, so both give the same bits. kL2: load through L2 only (__ldcg), for a CTA
// reading what other CTAs of its own grid stored.

template <bool kL2>
__device__ __forceinline__ float load_partial(const float* p) {
  if constexpr (kL2) {
    return __ldcg(p);
  } else {
    return *p;
  }
}

struct SplitTotals {
  float m_all, inv_l;
};

// The largest split max and 1 / the rescaled sum of the split sums, in split order, over the
// splits of record range [first, first + used_splits).
template <bool kL2>
__device__ __forceinline__ SplitTotals split_totals(const float* ml, int64_t first,
                                                    int used_splits) {
  float m_all = -INFINITY;
  for (int s = 0; s < used_splits; ++s)
    m_all = fmaxf(m_all, load_partial<kL2>(ml + 2 * (first + s)));
  float l_all = 0.0f;
  for (int s = 0; s < used_splits; ++s)
    l_all += load_partial<kL2>(ml + 2 * (first + s) + 1) *
             expf(load_partial<kL2>(ml + 2 * (first + s)) - m_all);
  return {m_all, 1.0f / l_all};
}

// Element d of the merged output of those splits (their accs rescaled, in split order),
// divided by the sum.
template <bool kL2>
__device__ __forceinline__ float merged_split_value(const float* partials, const float* ml,
                                                    int64_t first, int used_splits, int hd, int d,
                                                    const SplitTotals& totals) {
  float acc = 0.0f;
  for (int s = 0; s < used_splits; ++s)
    acc += load_partial<kL2>(partials + (first + s) * hd + d) *
           expf(load_partial<kL2>(ml + 2 * (first + s)) - totals.m_all);
  return acc * totals.inv_l;
}

// The last-block merge's end of a split CTA of row r (token t), serving query heads
// [head0, head0 + heads): after the CTA's partials are stored, it counts itself in; the CTA
// that counts last merges those heads' splits into out and resets the counter. Every thread
// of the CTA calls it (barriers).
__device__ __forceinline__ void merge_splits_if_last(const PagedAttentionArgs& a,
                                                     int32_t* split_counters, int64_t r, int64_t t,
                                                     int head0, int heads, int used_splits) {
  __shared__ int last;
  __threadfence();  // this thread's partials visible device-wide before the CTA counts itself
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t* counter = split_counters + r * gridDim.y + blockIdx.y;
    last = atomicAdd(counter, 1) == used_splits - 1;
    if (last) *counter = 0;  // every split has counted: 0 for the next launch
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // the splits that counted before this CTA stored their partials before
  const int hd = a.head_dim;
  const float* ml = a.partials + a.num_tokens * a.hq * a.num_splits * hd;
  for (int i = threadIdx.x; i < heads * hd; i += blockDim.x) {
    const int h = i / hd, d = i % hd;
    const int64_t first = (r * a.hq + head0 + h) * a.num_splits;
    const SplitTotals totals = split_totals<true>(ml, first, used_splits);
    store_activation(a.out, a.out_dtype == DType::BF16, (t * a.hq + head0 + h) * hd + d,
                     merged_split_value<true>(a.partials, ml, first, used_splits, hd, d, totals));
  }
}

// One CTA: row blockIdx.x (token a.rows[blockIdx.x], or blockIdx.x without a row list); KV head
// blockIdx.y / head_chunks with its query heads [chunk * kHeads, ...) of the group (chunk =
// blockIdx.y % head_chunks); split blockIdx.z. S: float or uint16_t (bf16 bits). kVec: elements per
// load (16 bytes, or 1); kChunks: loads per lane per row (a lane holds kVec * kChunks elements of
// hd: chunk c at vector c * L + lane-in-group). kHeads: query heads per CTA (a power of two;
// `heads` of them live). kMergeLast: the last-block merge on split_counters (a counter per
// (row, blockIdx.y)) in place of the merge kernel; its own instances, so the kernels without it
// keep their code (and ignore split_counters).
template <class S, int kVec, int kChunks, int kHeads, bool kMergeLast>
__global__ void __launch_bounds__(kAttentionThreads, kHeads <= 4 ? kCtasPerSm : 2)
    paged_attention_kernel(const PagedAttentionArgs a, int lanes_per_key, int head_chunks,
                           int32_t* split_counters) {
  wait_for_previous_kernel();
  constexpr int kElems = kVec * kChunks;
  const int64_t r = blockIdx.x;              // the launch's row: indexes the split partials
  const int64_t t = a.rows ? a.rows[r] : r;  // the token: q, out, positions
  const int split = blockIdx.z;
  const int context = a.positions[t] + 1;  // causal: positions 0..positions[t]
  const int begin = split * a.split_len;
  if (begin >= context) return;  // the whole CTA leaves, before any barrier
  const int used_splits = splits_of(context, a.split_len, a.num_splits);
  const int end = split == used_splits - 1 ? context : begin + a.split_len;

  const int hd = a.head_dim;
  const int group = a.hq / a.hkv;
  const int kv_head = blockIdx.y / head_chunks;
  const int first_in_group = (blockIdx.y % head_chunks) * kHeads;
  const int head0 = kv_head * group + first_in_group;
  const int heads = min(kHeads, group - first_in_group);

  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int L = lanes_per_key;
  const int in_group = lane & (L - 1);
  const int keys_per_warp = 32 / L;
  const int keys_per_cta = kAttentionWarps * keys_per_warp;

  // This lane's slice of q for each query head (0 beyond hd and for heads not served).
  float q[kHeads][kElems];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    const float* qh = a.q + (t * a.hq + head0 + h) * hd;
#pragma unroll
    for (int c = 0; c < kChunks; ++c)
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const int idx = (c * L + in_group) * kVec + e;
        q[h][c * kVec + e] = h < heads && idx < hd ? qh[idx] : 0.0f;
      }
  }

  float m[kHeads], l[kHeads], acc[kHeads][kElems];
#pragma unroll
  for (int h = 0; h < kHeads; ++h) {
    m[h] = -INFINITY;
    l[h] = 0.0f;
#pragma unroll
    for (int e = 0; e < kElems; ++e) acc[h][e] = 0.0f;
  }

  const S* k_cache = static_cast<const S*>(a.k_cache);
  const S* v_cache = static_cast<const S*>(a.v_cache);
  const int32_t* table = a.block_table + static_cast<int64_t>(a.seq_of_token[t]) * a.max_blocks;
  const int64_t row = static_cast<int64_t>(a.hkv) * hd;
  const int64_t head_offset = static_cast<int64_t>(kv_head) * hd;
  // The loop bound is the same for the whole warp (the shuffles need every lane); a lane
  // whose key lies past the split's end loads nothing and leaves its state alone.
  for (int first = begin + warp * keys_per_warp; first < end; first += keys_per_cta) {
    const int p = first + lane / L;
    const bool valid = p < end;
    float kx[kElems], vx[kElems];
    if (valid) {
      const int64_t slot =
          static_cast<int64_t>(table[p / a.block_size]) * a.block_size + p % a.block_size;
      const S* kp = k_cache + slot * row + head_offset;
      const S* vp = v_cache + slot * row + head_offset;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int base = (c * L + in_group) * kVec;
        float kc[kVec], vc[kVec];
        if (base < hd) {
          load_widened<S, kVec>(kp + base, kc);
          load_widened<S, kVec>(vp + base, vc);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) kc[e] = vc[e] = 0.0f;
        }
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          kx[c * kVec + e] = kc[e];
          vx[c * kVec + e] = vc[e];
        }
      }
    } else {
#pragma unroll
      for (int e = 0; e < kElems; ++e) kx[e] = vx[e] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < kElems; ++e) dot = fmaf(q[h][e], kx[e], dot);
      const float score = key_group_sum(dot, L) * a.scale;
      if (valid) {
        const float m_new = fmaxf(m[h], score);
        const float correction = expf(m[h] - m_new);  // 0 on the first key (m = -inf)
        const float w = expf(score - m_new);
        l[h] = l[h] * correction + w;
#pragma unroll
        for (int e = 0; e < kElems; ++e) acc[h][e] = acc[h][e] * correction + w * vx[e];
        m[h] = m_new;
      }
    }
  }

  // Merge the warp's key groups (lanes that differ in the bits above L) by xor butterfly.
  for (int offset = L; offset < 32; offset <<= 1) {
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      const float m_other = __shfl_xor_sync(0xffffffffu, m[h], offset);
      const float l_other = __shfl_xor_sync(0xffffffffu, l[h], offset);
      const float m_new = fmaxf(m[h], m_other);
      const float mine = rescale(m[h], m_new), other = rescale(m_other, m_new);
      l[h] = l[h] * mine + l_other * other;
#pragma unroll
      for (int e = 0; e < kElems; ++e) {
        const float acc_other = __shfl_xor_sync(0xffffffffu, acc[h][e], offset);
        acc[h][e] = acc[h][e] * mine + acc_other * other;
      }
      m[h] = m_new;
    }
  }

  // Merge the warps through shared memory, in warp order.
  __shared__ float warp_m[kAttentionWarps][kHeads], warp_l[kAttentionWarps][kHeads];
  __shared__ float warp_acc[kHeads][kAttentionWarps][kMaxAttentionHeadDim];
  if (lane < L) {  // the first key group holds the warp's merged state
#pragma unroll
    for (int h = 0; h < kHeads; ++h) {
      if (lane == 0) {
        warp_m[warp][h] = m[h];
        warp_l[warp][h] = l[h];
      }
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          const int idx = (c * L + in_group) * kVec + e;
          if (idx < hd) warp_acc[h][warp][idx] = acc[h][c * kVec + e];
        }
    }
  }
  __syncthreads();

  const bool direct = used_splits == 1;
  for (int i = threadIdx.x; i < heads * hd; i += kAttentionThreads) {
    const int h = i / hd, d = i % hd;
    float m_all = -INFINITY;
#pragma unroll
    for (int w = 0; w < kAttentionWarps; ++w) m_all = fmaxf(m_all, warp_m[w][h]);
    float l_all = 0.0f, acc_all = 0.0f;
#pragma unroll
    for (int w = 0; w < kAttentionWarps; ++w) {
      const float r = rescale(warp_m[w][h], m_all);
      l_all += warp_l[w][h] * r;
      acc_all += warp_acc[h][w][d] * r;
    }
    const int64_t head_row = t * a.hq + head0 + h;
    if (direct) {
      store_activation(a.out, a.out_dtype == DType::BF16, head_row * hd + d,
                       acc_all * (1.0f / l_all));
    } else {
      // partials: [rows * hq, num_splits] records of (m, l) after rows * hq * num_splits * hd
      // accs
      const int64_t record = (r * a.hq + head0 + h) * a.num_splits + split;
      a.partials[record * hd + d] = acc_all;
      if (d == 0) {
        float* ml = a.partials + a.num_tokens * a.hq * a.num_splits * hd;
        ml[2 * record] = m_all;
        ml[2 * record + 1] = l_all;
      }
    }
  }
  if constexpr (kMergeLast) {
    if (!direct) merge_splits_if_last(a, split_counters, r, t, head0, heads, used_splits);
  }
}

// out for the tokens that used more than one split: their splits' (m, l, acc) combined in
// split order. One CTA per (row blockIdx.x, query head blockIdx.y), a thread per element.
__global__ void __launch_bounds__(kMergeThreads, 1)
    merge_attention_splits_kernel(const PagedAttentionArgs a) {
  wait_for_previous_kernel();
  const int64_t r = blockIdx.x;
  const int64_t t = a.rows ? a.rows[r] : r;
  const int hd = a.head_dim;
  const int used_splits = splits_of(a.positions[t] + 1, a.split_len, a.num_splits);
  if (used_splits <= 1) return;  // written directly by the attention kernel
  const int64_t first = (r * a.hq + blockIdx.y) * a.num_splits;
  const float* ml = a.partials + a.num_tokens * a.hq * a.num_splits * hd;
  const SplitTotals totals = split_totals<false>(ml, first, used_splits);
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    store_activation(a.out, a.out_dtype == DType::BF16, (t * a.hq + blockIdx.y) * hd + d,
                     merged_split_value<false>(a.partials, ml, first, used_splits, hd, d, totals));
  }
}

int next_power_of_two(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

// The grid's y: a CTA column per (KV head, head chunk).
int head_chunks_of(int hq, int hkv) {
  const int group = hq / hkv;
  const int heads = attention_heads_per_cta(group);
  return (group + heads - 1) / heads;
}

template <class S, int kVec, int kChunks, bool kMergeLast>
void launch_for_heads(const PagedAttentionArgs& args, int lanes_per_key, int32_t* split_counters,
                      cudaStream_t stream) {
  const int heads = attention_heads_per_cta(args.hq / args.hkv);
  const int head_chunks = head_chunks_of(args.hq, args.hkv);
  const dim3 grid(static_cast<unsigned>(args.num_tokens),
                  static_cast<unsigned>(args.hkv * head_chunks),
                  static_cast<unsigned>(args.num_splits));
  switch (heads) {
    case 1:
      launch_kernel(paged_attention_kernel<S, kVec, kChunks, 1, kMergeLast>, grid,
                    kAttentionThreads, 0, stream, args, lanes_per_key, head_chunks, split_counters);
      break;
    case 2:
      launch_kernel(paged_attention_kernel<S, kVec, kChunks, 2, kMergeLast>, grid,
                    kAttentionThreads, 0, stream, args, lanes_per_key, head_chunks, split_counters);
      break;
    case 4:
      launch_kernel(paged_attention_kernel<S, kVec, kChunks, 4, kMergeLast>, grid,
                    kAttentionThreads, 0, stream, args, lanes_per_key, head_chunks, split_counters);
      break;
    default:
      launch_kernel(paged_attention_kernel<S, kVec, kChunks, kMaxHeadsPerCta, kMergeLast>, grid,
                    kAttentionThreads, 0, stream, args, lanes_per_key, head_chunks, split_counters);
      break;
  }
}

// split_counters: null, or the last-block merge's counters (enough of them).
template <class S, int kVec, int kChunks>
void launch_for_heads(const PagedAttentionArgs& args, int lanes_per_key, int32_t* split_counters,
                      cudaStream_t stream) {
  if (split_counters) {
    launch_for_heads<S, kVec, kChunks, true>(args, lanes_per_key, split_counters, stream);
  } else {
    launch_for_heads<S, kVec, kChunks, false>(args, lanes_per_key, nullptr, stream);
  }
}

bool aligned_16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// 16-byte loads when a row splits into whole 16-byte vectors (hd * sizeof(S) % 16 == 0 and
// the cache 16-byte aligned), at most 64 of them (hd <= 256 f32); scalar loads otherwise.
template <class S>
void launch_for_storage(const PagedAttentionArgs& args, int32_t* split_counters,
                        cudaStream_t stream) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(S));
  const int hd = args.head_dim;
  if (hd % kVec == 0 && aligned_16(args.k_cache) && aligned_16(args.v_cache)) {
    const int vectors = hd / kVec;
    if (vectors <= 32) {
      launch_for_heads<S, kVec, 1>(args, next_power_of_two(vectors), split_counters, stream);
    } else if constexpr (32 * kVec < kMaxAttentionHeadDim) {  // f32 with hd > 128
      launch_for_heads<S, kVec, 2>(args, 32, split_counters, stream);
    }
  } else {  // 8 elements per lane cover hd <= 256 at 32 lanes per key
    launch_for_heads<S, 1, 8>(args, std::min(32, next_power_of_two(hd)), split_counters, stream);
  }
}

}  // namespace

void launch_store_kv(const float* k, const float* v, const int32_t* slots, int64_t num_tokens,
                     int64_t row_elems, void* k_cache, void* v_cache, DType cache_dtype,
                     cudaStream_t stream) {
  if (num_tokens == 0 || row_elems == 0) return;
  const unsigned blocks = static_cast<unsigned>(num_tokens);
  const int threads = row_block_threads(row_elems, kStoreThreads);
  switch (cache_dtype) {
    case DType::F32:
      launch_kernel(store_kv_kernel<float>, blocks, threads, 0, stream, k, v, slots, row_elems,
                    static_cast<float*>(k_cache), static_cast<float*>(v_cache));
      break;
    case DType::BF16:
      launch_kernel(store_kv_kernel<uint16_t>, blocks, threads, 0, stream, k, v, slots, row_elems,
                    static_cast<uint16_t*>(k_cache), static_cast<uint16_t*>(v_cache));
      break;
    default:
      throw Error("store_kv: the CUDA kv cache must be F32 or BF16, got " +
                  std::string(dtype_name(cache_dtype)));
  }
  CUDA_CHECK_LAUNCH();
}

int attention_heads_per_cta(int group) {
  return std::min(next_power_of_two(std::max(group, 1)), kMaxHeadsPerCta);
}

AttentionSplitPlan plan_attention_splits(int64_t num_tokens, int hq, int hkv, int max_context,
                                         int sm_count) {
  AttentionSplitPlan plan;
  plan.split_len = std::max(max_context, 1);
  if (num_tokens <= 0 || hkv <= 0 || hq < hkv || max_context <= kMinAttentionSplitLen) return plan;
  const int group = hq / hkv;
  const int heads = attention_heads_per_cta(group);
  const int64_t ctas = num_tokens * hkv * ((group + heads - 1) / heads);
  const int64_t target = static_cast<int64_t>(kCtasPerSm) * std::max(sm_count, 1);
  if (ctas >= target) return plan;  // the batch alone fills the GPU
  int64_t splits = (target + ctas - 1) / ctas;
  splits =
      std::min<int64_t>(splits, (max_context + kMinAttentionSplitLen - 1) / kMinAttentionSplitLen);
  splits = std::min<int64_t>(splits, kMaxAttentionSplits);
  if (splits <= 1) return plan;
  plan.split_len = static_cast<int>((max_context + splits - 1) / splits);
  plan.num_splits = (max_context + plan.split_len - 1) / plan.split_len;
  return plan;
}

int64_t attention_split_counters_needed(const PagedAttentionArgs& args) {
  if (args.num_splits <= 1 || args.hkv <= 0) return 0;
  return args.num_tokens * args.hkv * head_chunks_of(args.hq, args.hkv);
}

int64_t attention_split_counter_bound(int sm_count) {
  return static_cast<int64_t>(kCtasPerSm) * std::max(sm_count, 1);
}

int64_t attention_partial_floats(const PagedAttentionArgs& args) {
  if (args.num_splits <= 1) return 0;
  return args.num_tokens * args.hq * args.num_splits * (args.head_dim + 2);
}

void launch_paged_attention(const PagedAttentionArgs& args, cudaStream_t stream) {
  launch_paged_attention(args, AttentionSplitCounters{}, stream);
}

void launch_paged_attention(const PagedAttentionArgs& args, const AttentionSplitCounters& counters,
                            cudaStream_t stream) {
  if (args.num_tokens == 0 || args.hq == 0) return;
  ATTNRES_CHECK(args.head_dim > 0 && args.head_dim <= kMaxAttentionHeadDim,
                "attention head_dim " + std::to_string(args.head_dim));
  ATTNRES_CHECK(args.hkv > 0 && args.hq % args.hkv == 0 && args.block_size > 0,
                "attention: bad head / block configuration");
  ATTNRES_CHECK(args.num_splits >= 1 && args.num_splits <= kMaxAttentionSplits &&
                    args.split_len >= 1 && (args.num_splits == 1 || args.partials != nullptr),
                "attention: bad context split (" + std::to_string(args.num_splits) + " of " +
                    std::to_string(args.split_len) + " positions)");
  // Grid y is hkv x head chunks <= hq (and hq for the merge).
  ATTNRES_CHECK(args.num_tokens <= INT32_MAX && args.hq <= 65535,
                "attention: grid too large (" + std::to_string(args.num_tokens) + " tokens, " +
                    std::to_string(args.hq) + " query heads)");
  ATTNRES_CHECK(args.out_dtype == DType::F32 || args.out_dtype == DType::BF16,
                "attention: out must be F32 or BF16");
  // The last-block merge where the launch has counters enough; otherwise the merge kernel.
  const int64_t needed = attention_split_counters_needed(args);
  int32_t* split_counters =
      counters.counters && needed > 0 && needed <= counters.capacity ? counters.counters : nullptr;
  switch (args.kv_dtype) {
    case DType::F32:
      launch_for_storage<float>(args, split_counters, stream);
      break;
    case DType::BF16:
      launch_for_storage<uint16_t>(args, split_counters, stream);
      break;
    default:
      throw Error("attention: the CUDA kv cache must be F32 or BF16, got " +
                  std::string(dtype_name(args.kv_dtype)));
  }
  CUDA_CHECK_LAUNCH();
  if (args.num_splits > 1 && !split_counters) {
    const dim3 grid(static_cast<unsigned>(args.num_tokens), static_cast<unsigned>(args.hq));
    launch_kernel(merge_attention_splits_kernel, grid,
                  row_block_threads(args.head_dim, kMergeThreads), 0, stream, args);
    CUDA_CHECK_LAUNCH();
  }
}

}  // namespace attnres::cuda
