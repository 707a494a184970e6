// Backend::sample on the GPU (engine/core/backend.h): each row's logits become a token id
// with the host Sampler's pipeline (engine/sample/sampler.h), in its order: check (NaN / +inf,
// a finite decodable logit), padding mask, the structured-output token bitmask, min_tokens
// blocking, penalties, then greedy argmax, or temperature, top-k, top-p, min-p and the draw.
// Layout: logits [rows, vocab] f32 (the sampled rows are overwritten), rows[] the parameters,
// token_ids the ids the rows' ranges point into, bitmask [mask rows, (vocab + 31) / 32] int32
// (a row's allowed ids, xgrammar's layout), counts [rows, vocab] int32 zeros (penalty
// scratch; left zero), out [rows] int32.
//
// Why it is shaped this way:
// - A row is a thread-block cluster of 1, 2, 4 or 8 CTAs of 512 threads
//   (plan_sample_ctas_per_row): CTA k owns ids [k * slice, (k + 1) * slice) and every pass
//   over the vocabulary (check, max, the radix histograms, the sums, the id-order walk) runs
//   on the CTAs' slices at once, so a batch of 1..16 rows still reaches most SMs. The CTAs
//   merge through distributed shared memory: each publishes its aggregate (a flag, an argmax,
//   a mass, a 256-digit histogram), one cluster barrier, and every CTA reads every rank's and
//   combines them in rank order, so all CTAs take the same branches. Every merge is exact
//   (integer masses, a max with ties by id), so any split gives the one-CTA result bit for bit.
//   A CTA reads and writes only its slice of the row (penalties included: each applies the ids
//   that fall in its slice), so no CTA waits on another's global-memory writes.
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
//   the count) per digit, the digit where the prefix crosses the target kept (a block scan
//   over the 256 digits finds it). Token-id order (no top-k / top-p) is one block scan of
//   per-thread segments instead, offset by the lower-ranked CTAs' totals.
// - Deterministic: masses are fixed point (weight * 2^44, integers), so every histogram, sum
//   and scan is exact whatever the order of the atomics or the split. The price against the
//   host (double sums of f32 weights): a weight below 2^-44 counts as 0 and each crossing can
//   move by about vocab * 2^-44 of the total (1e-8), far inside the tolerance the tests state
//   (1e-5).
#include <cooperative_groups.h>

#include <algorithm>
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <string>

#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {
namespace {

namespace cg = cooperative_groups;

// 512, not 1024: at 64 registers (1024 threads) ptxas spilled ~200 bytes; 69 at 512 do not.
constexpr int kSampleThreads = 512;
constexpr float kMassScale = 17592186044416.0f;  // 2^44: vocab * 2^44 < 2^64 for vocab < 2^20

// The CTAs of one row: a cluster of kCtas (1: a plain block, and every call is its CTA-wide
// counterpart).
template <int kCtas>
struct RowCluster {
  __device__ static unsigned rank() {
    if constexpr (kCtas == 1) {
      return 0;
    } else {
      return cg::this_cluster().block_rank();
    }
  }
  // A barrier over the row's threads; shared-memory writes before it are visible to every
  // CTA of the row after it (the cluster barrier releases and acquires at cluster scope).
  __device__ static void sync() {
    if constexpr (kCtas == 1) {
      __syncthreads();
    } else {
      cg::this_cluster().sync();
    }
  }
  // `local`'s counterpart in the shared memory of rank r.
  template <class T>
  __device__ static T* at(T* local, unsigned r) {
    if constexpr (kCtas == 1) {
      (void)r;
      return local;
    } else {
      return cg::this_cluster().map_shared_rank(local, r);
    }
  }
  // Before a CTA exits: another CTA may still be reading its shared memory.
  __device__ static void finish() {
    if constexpr (kCtas > 1) cg::this_cluster().sync();
  }
};

// The row's merges. Merge number `phase` writes slot [phase & 1] (thread 0, its CTA's
// aggregate), passes one cluster barrier and reads every rank's slot [phase & 1]; then phase
// advances. A slot is rewritten two merges later, past the barrier of the merge between, which
// no CTA reaches before it has read the slot. The select histograms follow the same rule.
struct Exchange {
  unsigned long long value[2][2];
};

template <int kCtas>
__device__ void publish(Exchange& x, int phase, unsigned long long a, unsigned long long b = 0) {
  if (threadIdx.x == 0) {
    x.value[phase & 1][0] = a;
    x.value[phase & 1][1] = b;
  }
  RowCluster<kCtas>::sync();
}

template <int kCtas>
__device__ unsigned long long published(Exchange& x, int phase, unsigned rank, int which) {
  return RowCluster<kCtas>::at(&x, rank)->value[phase & 1][which];
}

struct Candidates {
  const float* x;  // the processed (temperature-scaled) logits
  int64_t begin, end;  // this CTA's slice of the row
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
  unsigned long long mass[2][256];  // this CTA's histogram, by merge parity (see Exchange)
  unsigned int count[2][256];
  unsigned long long key;  // the unique element's key, when this CTA holds it
  unsigned long long above;
  int digit;
  int unique;
};

using BlockSum = cub::BlockReduce<unsigned long long, kSampleThreads>;
using BlockScanU64 = cub::BlockScan<unsigned long long, kSampleThreads>;

// The key of the first element of the set, in descending key order, whose inclusive prefix
// of mass (count_mode: of count) exceeds target; false when the whole set does not. Every CTA
// of the row returns the same.
template <int kCtas>
__device__ __noinline__ bool select_first_above(const Candidates& c, unsigned long long target,
                                                bool count_mode, SelectShared& s,
                                                BlockScanU64::TempStorage& scan, Exchange& x,
                                                int& phase, unsigned long long& out_key) {
  using Cluster = RowCluster<kCtas>;
  unsigned long long prefix = 0, prefix_mask = 0, above = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    const int b = phase & 1;
    for (int d = threadIdx.x; d < 256; d += blockDim.x) {
      s.mass[b][d] = 0;
      s.count[b][d] = 0;
    }
    __syncthreads();
    for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
      const float w = c.weight(i);
      const uint64_t k = c.key(i, w);
      if (k < c.floor_key || w < c.min_weight || (k & prefix_mask) != prefix) continue;
      const int d = static_cast<int>((k >> shift) & 0xFF);
      atomicAdd(&s.mass[b][d], count_mode ? 1ull : Candidates::mass(w));
      atomicAdd(&s.count[b][d], 1u);
    }
    Cluster::sync();
    // Thread t < 256 sums digit 255 - t over the row's CTAs: descending digits, so the
    // exclusive prefix over the threads is the mass above the thread's digit.
    unsigned long long mass = 0;
    unsigned int count = 0;
    if (threadIdx.x < 256) {
      const int d = 255 - static_cast<int>(threadIdx.x);
      for (unsigned rank = 0; rank < kCtas; ++rank) {
        const SelectShared* other = Cluster::at(&s, rank);
        mass += other->mass[b][d];
        count += other->count[b][d];
      }
    }
    ++phase;
    unsigned long long inclusive = 0;
    BlockScanU64(scan).InclusiveSum(mass, inclusive);
    // At most one thread crosses the target; the last thread (no digit) sees the whole mass.
    if (threadIdx.x < 256 && above + inclusive > target && above + inclusive - mass <= target) {
      s.digit = 255 - static_cast<int>(threadIdx.x);
      s.above = above + inclusive - mass;
      s.unique = count == 1;
      s.key = 0;
    } else if (threadIdx.x == blockDim.x - 1 && above + inclusive <= target) {
      s.digit = -1;
    }
    __syncthreads();
    const int digit = s.digit;
    if (digit < 0) return false;
    above = s.above;
    const bool unique = s.unique;
    prefix |= static_cast<unsigned long long>(digit) << shift;
    prefix_mask |= 0xFFull << shift;
    if (unique && shift > 0) {
      // One element left in the bucket: find it instead of resolving its remaining digits.
      for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
        const float w = c.weight(i);
        const uint64_t k = c.key(i, w);
        if (k >= c.floor_key && w >= c.min_weight && (k & prefix_mask) == prefix) s.key = k;
      }
      __syncthreads();
      publish<kCtas>(x, phase, s.key);  // 0 from the CTAs without it (a key is never 0)
      unsigned long long key = 0;
      for (unsigned rank = 0; rank < kCtas; ++rank)
        key = max(key, published<kCtas>(x, phase, rank, 0));
      ++phase;
      out_key = key;
      return true;
    }
  }
  out_key = prefix;
  return true;
}

template <int kCtas>
__device__ __noinline__ unsigned long long set_mass(const Candidates& c,
                                                    BlockSum::TempStorage& temp, Exchange& x,
                                                    int& phase) {
  unsigned long long local = 0;
  for (int64_t i = c.begin + threadIdx.x; i < c.end; i += blockDim.x) {
    const float w = c.weight(i);
    if (c.key(i, w) >= c.floor_key && w >= c.min_weight) local += Candidates::mass(w);
  }
  publish<kCtas>(x, phase, BlockSum(temp).Sum(local));
  unsigned long long total = 0;
  for (unsigned rank = 0; rank < kCtas; ++rank) total += published<kCtas>(x, phase, rank, 0);
  ++phase;
  return total;
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
using BlockArgMax = cub::BlockReduce<ArgMax, kSampleThreads>;

template <int kCtas>
__global__ void __cluster_dims__(kCtas, 1, 1) __launch_bounds__(kSampleThreads, 1)
    sample_kernel(float* logits, int64_t vocab, int64_t slice, int32_t decodable,
                  const SampleRow* rows, const int32_t* token_ids, const int32_t* bitmask,
                  int32_t* counts, int32_t* out) {
  using Cluster = RowCluster<kCtas>;
  extern __shared__ unsigned int seen[];  // [(slice + 31) / 32] repetition marks
  wait_for_previous_kernel();
  __shared__ union {
    BlockSum::TempStorage sum;
    BlockScanU64::TempStorage scan;
    BlockArgMax::TempStorage argmax;
  } temp;
  __shared__ SelectShared select;
  __shared__ Exchange exchange;
  __shared__ int crossing;

  const int64_t r = blockIdx.x / kCtas;
  const unsigned rank = Cluster::rank();
  const int64_t begin = min(vocab, static_cast<int64_t>(rank) * slice);
  const int64_t end = min(vocab, begin + slice);
  const SampleRow& p = rows[r];  // read where used: fewer live registers
  float* x = logits + r * vocab;
  const int tid = threadIdx.x, threads = blockDim.x;
  int phase = 0;  // merges so far (see Exchange)

  // Check the raw row, then mask the padding rows and the ids the row's structured-output
  // bitmask forbids (check_logits_row, Vocabulary::mask_padding, ConstraintMatcher::apply; a
  // row the check refuses returns below, its masked values unread). A slice starts on a whole
  // word (sample_slice_ids), so a warp reads one word for 32 consecutive ids.
  const int32_t* mask = p.bitmask_row >= 0
                            ? bitmask + static_cast<int64_t>(p.bitmask_row) * ((vocab + 31) / 32)
                            : nullptr;
  int non_finite = 0, decodable_finite = 0;
  for (int64_t i = begin + tid; i < end; i += threads) {
    const float v = x[i];
    if (isnan(v) || v == INFINITY) non_finite = 1;
    if (i < decodable && isfinite(v)) decodable_finite = 1;
    const bool allowed =
        mask == nullptr || ((static_cast<uint32_t>(mask[i >> 5]) >> (i & 31)) & 1u);
    if (i >= decodable || !allowed) x[i] = -INFINITY;
  }
  non_finite = __syncthreads_or(non_finite);
  decodable_finite = __syncthreads_or(decodable_finite);
  publish<kCtas>(exchange, phase, non_finite, decodable_finite);
  for (unsigned k = 0; k < kCtas; ++k) {
    non_finite |= static_cast<int>(published<kCtas>(exchange, phase, k, 0));
    decodable_finite |= static_cast<int>(published<kCtas>(exchange, phase, k, 1));
  }
  ++phase;
  if (non_finite || !decodable_finite) {
    if (rank == 0 && tid == 0)
      out[r] = non_finite ? kSampleNonFiniteLogit : kSampleNoDecodableLogit;
    Cluster::finish();
    return;
  }

  // min_tokens: the blocked ids become -inf (the same value from any thread).
  for (int j = tid; j < p.blocked_count; j += threads) {
    const int32_t id = token_ids[p.blocked_begin + j];
    if (id >= begin && id < end) x[id] = -INFINITY;
  }
  __syncthreads();

  // Repetition penalty, once per distinct id of prompt + output.
  if (p.repetition_penalty != 1.0f) {
    const int words = static_cast<int>((end - begin + 31) / 32);
    for (int w = tid; w < words; w += threads) seen[w] = 0;
    __syncthreads();
    const int total = p.prompt_count + p.output_count;
    auto id_at = [&](int j) {
      return j < p.prompt_count ? token_ids[p.prompt_begin + j]
                                : token_ids[p.output_begin + (j - p.prompt_count)];
    };
    for (int j = tid; j < total; j += threads) {
      const int64_t at = id_at(j) - begin;
      if (at >= 0 && at < end - begin) atomicOr(&seen[at >> 5], 1u << (at & 31));
    }
    __syncthreads();
    for (int j = tid; j < total; j += threads) {
      const int32_t id = id_at(j);
      const int64_t at = id - begin;
      if (at < 0 || at >= end - begin) continue;
      const unsigned int bit = 1u << (at & 31);
      if (atomicAnd(&seen[at >> 5], ~bit) & bit) {
        const float l = x[id];
        x[id] = l > 0.0f ? l / p.repetition_penalty : l * p.repetition_penalty;
      }
    }
    __syncthreads();
  }
  // Presence and frequency penalties, once per distinct output id with its count.
  if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
    int32_t* row_counts = counts + r * vocab;
    for (int j = tid; j < p.output_count; j += threads) {
      const int32_t id = token_ids[p.output_begin + j];
      if (id >= begin && id < end) atomicAdd(&row_counts[id], 1);
    }
    __syncthreads();
    for (int j = tid; j < p.output_count; j += threads) {
      const int32_t id = token_ids[p.output_begin + j];
      if (id < begin || id >= end) continue;
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
  for (int64_t i = begin + tid; i < end; i += threads) {
    float v = x[i];
    if (!p.greedy) x[i] = v = v / p.temperature;
    const ArgMax candidate{v, static_cast<int32_t>(i)};
    best = ArgMaxOp()(best, candidate);
  }
  best = BlockArgMax(temp.argmax).Reduce(best, ArgMaxOp());
  publish<kCtas>(exchange, phase, __float_as_uint(best.value), static_cast<uint32_t>(best.id));
  for (unsigned k = 0; k < kCtas; ++k) {
    const ArgMax other{
        __uint_as_float(static_cast<uint32_t>(published<kCtas>(exchange, phase, k, 0))),
        static_cast<int32_t>(published<kCtas>(exchange, phase, k, 1))};
    best = k == 0 ? other : ArgMaxOp()(best, other);
  }
  ++phase;
  if (p.greedy) {
    if (rank == 0 && tid == 0) out[r] = best.id;  // an all -inf row: id 0, as argmax() gives
    Cluster::finish();
    return;
  }
  const float max_logit = best.value;
  if (max_logit == -INFINITY) {
    if (rank == 0 && tid == 0) out[r] = kSampleEveryLogitMasked;
    Cluster::finish();
    return;
  }

  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  const bool top_p = p.top_p < 1.0f;
  Candidates c{x, begin, end, max_logit, top_k, 0, 0.0f};
  if (!top_k && !top_p) {
    // Token-id order: the first id whose inclusive prefix of mass exceeds u * total. Each
    // thread owns a contiguous segment of its CTA's slice; a block scan of the segment sums,
    // offset by the lower ranks' totals, finds the thread whose segment holds the crossing,
    // and that thread walks it.
    c.min_weight = p.min_p;
    const int64_t segment = (end - begin + threads - 1) / threads;
    const int64_t seg_begin = min(end, begin + tid * segment);
    const int64_t seg_end = min(end, seg_begin + segment);
    unsigned long long local = 0;
    int32_t last_positive = -1;
    for (int64_t i = seg_begin; i < seg_end; ++i) {
      const float w = c.weight(i);
      if (w >= c.min_weight && Candidates::mass(w) > 0) {
        local += Candidates::mass(w);
        last_positive = static_cast<int32_t>(i);
      }
    }
    unsigned long long before = 0, slice_total = 0;
    BlockScanU64(temp.scan).ExclusiveSum(local, before, slice_total);
    if (tid == 0) crossing = -1;  // nobody crossed: rounding put the target at the very end
    publish<kCtas>(exchange, phase, slice_total);
    unsigned long long total = 0;
    for (unsigned k = 0; k < kCtas; ++k) {
      const unsigned long long other = published<kCtas>(exchange, phase, k, 0);
      total += other;
      if (k < rank) before += other;
    }
    ++phase;
    const unsigned long long target =
        static_cast<unsigned long long>(p.uniform * static_cast<double>(total));
    if (before <= target && target < before + local) {
      unsigned long long running = before;
      for (int64_t i = seg_begin; i < seg_end; ++i) {
        const float w = c.weight(i);
        if (w < c.min_weight) continue;
        running += Candidates::mass(w);
        if (running > target) {
          crossing = static_cast<int32_t>(i);
          break;
        }
      }
    }
    // The last id with positive mass (the host's last_positive), for when nobody crossed.
    const int32_t last =
        BlockArgMax(temp.argmax)
            .Reduce(ArgMax{static_cast<float>(last_positive), last_positive}, ArgMaxOp())
            .id;
    __syncthreads();  // crossing
    // +1: -1 (none) becomes 0, below every id.
    publish<kCtas>(exchange, phase, static_cast<unsigned long long>(crossing + 1),
                   static_cast<unsigned long long>(last + 1));
    unsigned long long crossed = 0, last_any = 0;
    for (unsigned k = 0; k < kCtas; ++k) {
      crossed = max(crossed, published<kCtas>(exchange, phase, k, 0));
      last_any = max(last_any, published<kCtas>(exchange, phase, k, 1));
    }
    ++phase;
    if (rank == 0 && tid == 0) {
      out[r] = static_cast<int32_t>(crossed != 0 ? crossed - 1 : last_any - 1);
    }
    Cluster::finish();
    return;
  }

  // Candidate-list order. Top-k: the set is the keys down to the k-th.
  unsigned long long key = 0;
  if (top_k) {
    select_first_above<kCtas>(c, static_cast<unsigned long long>(p.top_k - 1), true, select,
                              temp.scan, exchange, phase, key);
    c.floor_key = key;
  }
  // Top-p: the smallest prefix whose mass reaches top_p of the set's (its last element is the
  // first whose inclusive prefix is >= the target, i.e. > target - 1 in integers).
  if (top_p) {
    const unsigned long long total = set_mass<kCtas>(c, temp.sum, exchange, phase);
    const unsigned long long target =
        static_cast<unsigned long long>(static_cast<double>(p.top_p) * static_cast<double>(total));
    if (select_first_above<kCtas>(c, target > 0 ? target - 1 : 0, false, select, temp.scan,
                                  exchange, phase, key)) {
      c.floor_key = key;
    }
  }
  // Min-p: within the list, the weights >= min_p (the first, of weight 1, always is).
  c.min_weight = p.min_p;
  const unsigned long long total = set_mass<kCtas>(c, temp.sum, exchange, phase);
  const unsigned long long target =
      static_cast<unsigned long long>(p.uniform * static_cast<double>(total));
  if (!select_first_above<kCtas>(c, target, false, select, temp.scan, exchange, phase, key)) {
    // The last positive element.
    select_first_above<kCtas>(c, total - 1, false, select, temp.scan, exchange, phase, key);
  }
  if (rank == 0 && tid == 0)
    out[r] = static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(key));
  Cluster::finish();
}

template <int kCtas>
void launch_sample_kernel(float* logits, int64_t rows, int64_t vocab, int32_t decodable,
                          const SampleRow* row_args, const int32_t* token_ids,
                          const int32_t* bitmask, int32_t* counts, int32_t* out,
                          cudaStream_t stream) {
  const int64_t slice = sample_slice_ids(vocab, kCtas);
  const size_t seen_bytes = static_cast<size_t>((slice + 31) / 32) * sizeof(unsigned int);
  // The grid is a whole number of clusters (__cluster_dims__ fixes kCtas at compile time).
  launch_kernel(sample_kernel<kCtas>, dim3(static_cast<unsigned>(rows * kCtas)),
                dim3(kSampleThreads), seen_bytes, stream, logits, vocab, slice, decodable, row_args,
                token_ids, bitmask, counts, out);
}

}  // namespace

int64_t sample_slice_ids(int64_t vocab, int ctas_per_row) {
  const int64_t ids = (vocab + ctas_per_row - 1) / ctas_per_row;
  return (ids + 31) / 32 * 32;  // whole 128-byte lines per CTA
}

int plan_sample_ctas_per_row(int64_t rows, int64_t vocab, int sm_count) {
  // At least enough CTAs that a slice's repetition bitmap fits in shared memory.
  int ctas = 1;
  while (ctas < kMaxSampleCtasPerRow && sample_slice_ids(vocab, ctas) > kMaxSampleSliceIds)
    ctas *= 2;
  // Then more while one wave of CTAs (one per SM: 512 threads of ~70 registers) still has
  // room and each CTA keeps enough ids to be worth its merges.
  while (ctas < kMaxSampleCtasPerRow && rows * ctas * 2 <= std::max(sm_count, 1) &&
         sample_slice_ids(vocab, ctas * 2) >= kMinSampleSliceIds) {
    ctas *= 2;
  }
  return ctas;
}

SampleStagingLayout sample_staging_layout(int64_t rows, int64_t num_ids, int64_t bitmask_words) {
  auto align = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  SampleStagingLayout layout;
  layout.ids_offset = align(static_cast<size_t>(rows) * sizeof(SampleRow));
  layout.bitmask_offset = layout.ids_offset + static_cast<size_t>(num_ids) * sizeof(int32_t);
  layout.upload_bytes =
      layout.bitmask_offset + static_cast<size_t>(bitmask_words) * sizeof(int32_t);
  layout.out_offset = align(layout.upload_bytes);
  layout.total_bytes = layout.out_offset + static_cast<size_t>(rows) * sizeof(int32_t);
  return layout;
}

size_t grown_staging_bytes(size_t capacity, size_t needed) {
  if (needed <= capacity) return capacity;
  return std::max(needed, capacity * 2);
}

void launch_sample(float* logits, int64_t rows, int64_t vocab, int32_t decodable,
                   const SampleRow* row_args, const int32_t* token_ids, const int32_t* bitmask,
                   int32_t* counts, int32_t* out, int ctas_per_row, cudaStream_t stream) {
  if (rows == 0) return;
  ATTNRES_CHECK(sample_slice_ids(vocab, ctas_per_row) <= kMaxSampleSliceIds,
                "sample: a slice of " + std::to_string(sample_slice_ids(vocab, ctas_per_row)) +
                    " ids per CTA (vocab " + std::to_string(vocab) + ", " +
                    std::to_string(ctas_per_row) + " CTAs per row) exceeds " +
                    std::to_string(kMaxSampleSliceIds) +
                    ", the shared memory of its repetition bitmap");
  switch (ctas_per_row) {
    case 1:
      launch_sample_kernel<1>(logits, rows, vocab, decodable, row_args, token_ids, bitmask, counts,
                              out, stream);
      break;
    case 2:
      launch_sample_kernel<2>(logits, rows, vocab, decodable, row_args, token_ids, bitmask, counts,
                              out, stream);
      break;
    case 4:
      launch_sample_kernel<4>(logits, rows, vocab, decodable, row_args, token_ids, bitmask, counts,
                              out, stream);
      break;
    case 8:
      launch_sample_kernel<8>(logits, rows, vocab, decodable, row_args, token_ids, bitmask, counts,
                              out, stream);
      break;
    default:
      throw Error("sample: " + std::to_string(ctas_per_row) +
                  " CTAs per row (expected 1, 2, 4 or 8)");
  }
  CUDA_CHECK(cudaGetLastError());
}

}  // namespace attnres::cuda
