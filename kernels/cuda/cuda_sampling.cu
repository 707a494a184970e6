// Backend::sample on the GPU (engine/core/backend.h): one block of 512 threads per row turns
// the row's logits into a token id with the host Sampler's pipeline (engine/sample/sampler.h),
// in its order: check (NaN / +inf, a finite decodable logit), padding mask, min_tokens
// blocking, penalties, then greedy argmax, or temperature, top-k, top-p, min-p and the draw.
// Layout: logits [rows, vocab] f32 (the sampled rows are overwritten), rows[] the parameters,
// token_ids the ids the rows' ranges point into, counts [rows, vocab] int32 zeros (penalty
// scratch; left zero), out [rows] int32.
//
// Why it is shaped this way:
// - Penalties scatter over the row's ids without a sort and without order-dependent floats:
//   the repetition penalty marks ids in a shared-memory bitmap (atomicOr) and the thread that
//   clears a mark (atomicAnd) applies it, once per distinct id; presence / frequency count
//   occurrences with integer atomics in `counts` and the thread that takes the count
//   (atomicExch to 0) applies both, so `counts` is zero again afterwards (the host's
//   PenaltyScratch trick).
// - No sort. TruncatedDistribution walks "descending probability, ties by lowest id" when a
//   candidate list exists (top-k: by logit; top-p: by weight) and token id order otherwise.
//   Here each element has a unique 64-bit key (the order's 32 bits, then ~id), and every
//   cut of that order (top-k's k-th element, top-p's smallest prefix, the draw's quantile)
//   is a radix select: 8-bit digits from the top, a shared-memory histogram of the mass (or
//   the count) per digit, the digit where the prefix crosses the target kept. Token-id order
//   (no top-k / top-p) is one block scan instead.
// - Deterministic: masses are fixed point (weight * 2^44, integers), so every histogram, sum
//   and scan is exact whatever the order of the atomics. The price against the host (double
//   sums of f32 weights): a weight below 2^-44 counts as 0 and each crossing can move by about
//   vocab * 2^-44 of the total (1e-8), far inside the tolerance the tests state (1e-5).
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

// 512, not 1024: at 64 registers (1024 threads) ptxas spilled ~200 bytes; 69 at 512 do not.
constexpr int kSampleThreads = 512;
constexpr float kMassScale = 17592186044416.0f;  // 2^44: vocab * 2^44 < 2^64 for vocab < 2^20

struct Candidates {
  const float* x;  // the processed (temperature-scaled) logits
  int64_t vocab;
  float max_logit;
  bool logit_order;    // keys by logit (top-k's order) or by weight (top-p's)
  uint64_t floor_key;  // only keys >= floor_key are in the set
  float min_weight;    // and only weights >= min_weight (min-p; 0: off)

  __device__ float weight(int64_t i) const { return expf(x[i] - max_logit); }
  __device__ uint64_t key(int64_t i, float w) const {
    uint32_t hi;
    if (logit_order) {
      // -0 and +0 are one value to the host's comparisons (a tie, broken by id).
      const uint32_t bits = x[i] == 0.0f ? 0u : __float_as_uint(x[i]);
      hi = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    } else {
      hi = __float_as_uint(w);  // w >= 0: the bits order like the values
    }
    return (static_cast<uint64_t>(hi) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
  }
  __device__ static uint64_t mass(float w) { return static_cast<uint64_t>(w * kMassScale); }
};

struct SelectShared {
  unsigned long long mass[256];
  unsigned int count[256];
  unsigned long long key;  // a unique element's key, or the chosen prefix
  unsigned long long above;
  int digit;
  int unique;
};

using BlockSum = cub::BlockReduce<unsigned long long, kSampleThreads>;
using BlockScanU64 = cub::BlockScan<unsigned long long, kSampleThreads>;

// The key of the first element of the set, in descending key order, whose inclusive prefix
// of mass (count_mode: of count) exceeds target; false when the whole set does not.
__device__ __noinline__ bool select_first_above(const Candidates& c, unsigned long long target,
                                                bool count_mode, SelectShared& s,
                                                unsigned long long& out_key) {
  unsigned long long prefix = 0, prefix_mask = 0, above = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += blockDim.x) {
      s.mass[d] = 0;
      s.count[d] = 0;
    }
    __syncthreads();
    for (int64_t i = threadIdx.x; i < c.vocab; i += blockDim.x) {
      const float w = c.weight(i);
      const uint64_t k = c.key(i, w);
      if (k < c.floor_key || w < c.min_weight || (k & prefix_mask) != prefix) continue;
      const int d = static_cast<int>((k >> shift) & 0xFF);
      atomicAdd(&s.mass[d], count_mode ? 1ull : Candidates::mass(w));
      atomicAdd(&s.count[d], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned long long running = above;
      s.digit = -1;
      for (int d = 255; d >= 0; --d) {
        if (running + s.mass[d] > target) {
          s.digit = d;
          break;
        }
        running += s.mass[d];
      }
      s.above = running;
      s.unique = s.digit >= 0 && s.count[s.digit] == 1;
    }
    __syncthreads();
    const int digit = s.digit;
    if (digit < 0) return false;
    above = s.above;
    prefix |= static_cast<unsigned long long>(digit) << shift;
    prefix_mask |= 0xFFull << shift;
    if (s.unique && shift > 0) {
      // One element left in the bucket: find it instead of resolving its remaining digits.
      for (int64_t i = threadIdx.x; i < c.vocab; i += blockDim.x) {
        const float w = c.weight(i);
        const uint64_t k = c.key(i, w);
        if (k >= c.floor_key && w >= c.min_weight && (k & prefix_mask) == prefix) s.key = k;
      }
      __syncthreads();
      out_key = s.key;
      __syncthreads();
      return true;
    }
    __syncthreads();  // s is rewritten by the next pass
  }
  out_key = prefix;
  return true;
}

__device__ __noinline__ unsigned long long set_mass(const Candidates& c,
                                                    BlockSum::TempStorage& temp,
                                                    unsigned long long* broadcast) {
  unsigned long long local = 0;
  for (int64_t i = threadIdx.x; i < c.vocab; i += blockDim.x) {
    const float w = c.weight(i);
    if (c.key(i, w) >= c.floor_key && w >= c.min_weight) local += Candidates::mass(w);
  }
  const unsigned long long total = BlockSum(temp).Sum(local);
  if (threadIdx.x == 0) *broadcast = total;
  __syncthreads();
  const unsigned long long result = *broadcast;
  __syncthreads();
  return result;
}

struct ArgMax {
  float value;
  int32_t id;
};
struct ArgMaxOp {
  __device__ ArgMax operator()(const ArgMax& a, const ArgMax& b) const {
    if (b.value > a.value || (b.value == a.value && b.id < a.id)) return b;
    return a;
  }
};

__global__ void __launch_bounds__(kSampleThreads, 1)
    sample_kernel(float* logits, int64_t vocab, int32_t decodable, const SampleRow* rows,
                  const int32_t* token_ids, int32_t* counts, int32_t* out) {
  wait_for_previous_kernel();
  extern __shared__ unsigned int seen[];  // [(vocab + 31) / 32] repetition marks
  __shared__ union {
    BlockSum::TempStorage sum;
    BlockScanU64::TempStorage scan;
    cub::BlockReduce<ArgMax, kSampleThreads>::TempStorage argmax;
  } temp;
  __shared__ SelectShared select;
  __shared__ unsigned long long broadcast;
  __shared__ float max_logit_shared;

  const int64_t r = blockIdx.x;
  const SampleRow& p = rows[r];  // read where used: fewer live registers
  float* x = logits + r * vocab;
  const int tid = threadIdx.x, threads = blockDim.x;

  // Check, then mask the padding rows (check_logits_row, Vocabulary::mask_padding).
  int non_finite = 0, decodable_finite = 0;
  for (int64_t i = tid; i < vocab; i += threads) {
    const float v = x[i];
    if (isnan(v) || v == INFINITY) non_finite = 1;
    if (i < decodable && isfinite(v)) decodable_finite = 1;
    if (i >= decodable) x[i] = -INFINITY;
  }
  non_finite = __syncthreads_or(non_finite);
  decodable_finite = __syncthreads_or(decodable_finite);
  if (non_finite || !decodable_finite) {
    if (tid == 0) out[r] = non_finite ? kSampleNonFiniteLogit : kSampleNoDecodableLogit;
    return;
  }

  // min_tokens: the blocked ids become -inf (the same value from any thread).
  for (int j = tid; j < p.blocked_count; j += threads)
    x[token_ids[p.blocked_begin + j]] = -INFINITY;
  __syncthreads();

  // Repetition penalty, once per distinct id of prompt + output.
  if (p.repetition_penalty != 1.0f) {
    const int words = static_cast<int>((vocab + 31) / 32);
    for (int w = tid; w < words; w += threads) seen[w] = 0;
    __syncthreads();
    const int total = p.prompt_count + p.output_count;
    auto id_at = [&](int j) {
      return j < p.prompt_count ? token_ids[p.prompt_begin + j]
                                : token_ids[p.output_begin + (j - p.prompt_count)];
    };
    for (int j = tid; j < total; j += threads) {
      const int32_t id = id_at(j);
      atomicOr(&seen[id >> 5], 1u << (id & 31));
    }
    __syncthreads();
    for (int j = tid; j < total; j += threads) {
      const int32_t id = id_at(j);
      const unsigned int bit = 1u << (id & 31);
      if (atomicAnd(&seen[id >> 5], ~bit) & bit) {
        const float l = x[id];
        x[id] = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
      }
    }
    __syncthreads();
  }
  // Presence and frequency penalties, once per distinct output id with its count.
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    int32_t* row_counts = counts + r * vocab;
    for (int j = tid; j < p.output_count; j += threads)
      atomicAdd(&row_counts[token_ids[p.output_begin + j]], 1);
    __syncthreads();
    for (int j = tid; j < p.output_count; j += threads) {
      const int32_t id = token_ids[p.output_begin + j];
      const int32_t count = atomicExch(&row_counts[id], 0);
      if (count != 0) {
        x[id] -= p.frequency_penalty * static_cast<float>(count);
        x[id] -= p.presence_penalty;
      }
    }
    __syncthreads();
  }

  // Greedy: argmax, ties by the lowest id. Random: temperature (NaN cannot occur: the row
  // was checked), then the row's max for the weights exp(logit - max).
  ArgMax best{-INFINITY, 0};
  for (int64_t i = tid; i < vocab; i += threads) {
    float v = x[i];
    if (!p.greedy) x[i] = v = v / p.temperature;
    const ArgMax candidate{v, static_cast<int32_t>(i)};
    best = ArgMaxOp()(best, candidate);
  }
  best = cub::BlockReduce<ArgMax, kSampleThreads>(temp.argmax).Reduce(best, ArgMaxOp());
  if (tid == 0) max_logit_shared = best.value;
  __syncthreads();
  if (p.greedy) {
    if (tid == 0) out[r] = best.id;  // an all -inf row: id 0, as argmax() gives
    return;
  }
  const float max_logit = max_logit_shared;
  if (max_logit == -INFINITY) {
    if (tid == 0) out[r] = kSampleEveryLogitMasked;
    return;
  }

  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  const bool top_p = p.top_p < 1.0f;
  Candidates c{x, vocab, max_logit, top_k, 0, 0.0f};
  if (!top_k && !top_p) {
    // Token-id order: the first id whose inclusive prefix of mass exceeds u * total. Each
    // thread owns a contiguous segment; a block scan of the segment sums finds the thread
    // whose segment holds the crossing, and that thread walks it.
    c.min_weight = p.min_p;
    const unsigned long long total = set_mass(c, temp.sum, &broadcast);
    const unsigned long long target =
        static_cast<unsigned long long>(p.uniform * static_cast<double>(total));
    const int64_t segment = (vocab + threads - 1) / threads;
    const int64_t begin = tid * segment, end = min(vocab, begin + segment);
    unsigned long long local = 0;
    int32_t last_positive = -1;
    for (int64_t i = begin; i < end; ++i) {
      const float w = c.weight(i);
      if (w >= c.min_weight && Candidates::mass(w) > 0) {
        local += Candidates::mass(w);
        last_positive = static_cast<int32_t>(i);
      }
    }
    unsigned long long before = 0;
    BlockScanU64(temp.scan).ExclusiveSum(local, before);
    if (tid == 0) broadcast = 0;  // nobody crossed: rounding put the target at the very end
    __syncthreads();
    if (before <= target && target < before + local) {
      unsigned long long running = before;
      for (int64_t i = begin; i < end; ++i) {
        const float w = c.weight(i);
        if (w < c.min_weight) continue;
        running += Candidates::mass(w);
        if (running > target) {
          out[r] = static_cast<int32_t>(i);
          broadcast = 1;
          break;
        }
      }
    }
    __syncthreads();
    if (broadcast == 0) {
      // The last id with positive mass (the host's last_positive).
      const int32_t last =
          cub::BlockReduce<ArgMax, kSampleThreads>(temp.argmax)
              .Reduce(ArgMax{static_cast<float>(last_positive), last_positive}, ArgMaxOp())
              .id;
      if (tid == 0) out[r] = last;
    }
    return;
  }

  // Candidate-list order. Top-k: the set is the keys down to the k-th.
  unsigned long long key = 0;
  if (top_k) {
    select_first_above(c, static_cast<unsigned long long>(p.top_k - 1), true, select, key);
    c.floor_key = key;
  }
  // Top-p: the smallest prefix whose mass reaches top_p of the set's (its last element is the
  // first whose inclusive prefix is >= the target, i.e. > target - 1 in integers).
  if (top_p) {
    const unsigned long long total = set_mass(c, temp.sum, &broadcast);
    const unsigned long long target =
        static_cast<unsigned long long>(static_cast<double>(p.top_p) * static_cast<double>(total));
    if (select_first_above(c, target > 0 ? target - 1 : 0, false, select, key)) c.floor_key = key;
  }
  // Min-p: within the list, the weights >= min_p (the first, of weight 1, always is).
  c.min_weight = p.min_p;
  const unsigned long long total = set_mass(c, temp.sum, &broadcast);
  const unsigned long long target =
      static_cast<unsigned long long>(p.uniform * static_cast<double>(total));
  if (!select_first_above(c, target, false, select, key)) {
    select_first_above(c, total - 1, false, select, key);  // the last positive element
  }
  if (tid == 0) out[r] = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
}

}  // namespace

void launch_sample(float* logits, int64_t rows, int64_t vocab, int32_t decodable,
                   const SampleRow* row_args, const int32_t* token_ids, int32_t* counts,
                   int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  const size_t seen_bytes = static_cast<size_t>((vocab + 31) / 32) * sizeof(unsigned int);
  launch_kernel(sample_kernel, static_cast<unsigned>(rows), kSampleThreads, seen_bytes, stream,
                logits, vocab, decodable, row_args, token_ids, counts, out);
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace attnres::cuda
