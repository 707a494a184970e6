// Attention's lever, the last-block merge (ATTNRES_CUDA_ATTN_LAST_BLOCK_MERGE,
// CudaBackend::set_attention_last_block_merge; kernels/cuda/NOTES.md "GEMV levers"): a split
// decode attention whose last split CTA to finish merges the splits, instead of the merge
// kernel. It keeps the merge's arithmetic and split order, so against the lever off:
// - the attention op at the 0.6B shape (hq 16, hkv 8, hd 128) at contexts that split and that
//   do not, batches 1, 8 and 64, decode rows beside a tensor-core prefill chunk (a row list),
//   a bf16 output, and small head layouts: bit for bit, the CPU within the flash-decoding
//   tolerance, one kernel launch where the lever off takes two, and the same bits again on a
//   second call (the counters went back to 0);
// - the kernel launched directly with forced split counts: bit for bit, every counter 0 after;
// - a graph of the op replayed twice into a poisoned output: the eager bits each time;
// - whole models' logits (plain and block AttnRes) over contexts that split: bit for bit;
// - the environment variable switches the lever when a backend is built.
// Without a GPU every test but the host one skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/model/kv_cache.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "kernels/cuda/cuda_attention_merge.h"
#include "kernels/cuda/cuda_kernels.h"
#include "tests/cpp/kernels/cuda/cuda_lever_test_util.h"
#include "tests/cpp/kernels/cuda/cuda_model_util.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"
#include "tests/cpp/kernels/cuda/paged_batch_util.h"

namespace attnres::test {
namespace {

// The flash-decoding tolerance against the CPU (cuda_flash_attention_test.cpp).
double tolerance_for(int max_context) { return max_context > 1024 ? 4e-5 : 2e-5; }

struct Problem {
  int hq, hkv, hd, block_size;
  BatchMeta batch;
  Tensor q, k, v;
  KvCacheLayer cpu_cache;  // the cache before the step (store_kv not yet run)
  int max_context = 0;
};

Problem make_problem(int hq, int hkv, int hd, int block_size, DType cache_dtype,
                     const std::vector<SeqSpec>& seqs, uint32_t seed) {
  Problem pb{hq, hkv, hd, block_size, {}, {}, {}, {}, {}, 0};
  std::mt19937 rng(seed);
  int num_blocks = 3;
  for (const SeqSpec& s : seqs) num_blocks += (s.cached + s.chunk + block_size - 1) / block_size;
  pb.batch = paged_batch(seqs, block_size, num_blocks, rng);
  for (const SeqSpec& s : seqs) pb.max_context = std::max(pb.max_context, s.cached + s.chunk);
  pb.cpu_cache.k = random_host({num_blocks, block_size, hkv, hd}, cache_dtype, rng);
  pb.cpu_cache.v = random_host({num_blocks, block_size, hkv, hd}, cache_dtype, rng);
  const int T = pb.batch.num_tokens;
  pb.k = random_host({T, hkv * hd}, DType::F32, rng);
  pb.v = random_host({T, hkv * hd}, DType::F32, rng);
  pb.q = random_host({T, hq * hd}, DType::F32, rng);
  return pb;
}

// A device tensor of `dtype` (F32 or BF16) full of NaN.
Tensor device_nan_of(Backend& be, const Shape& shape, DType dtype) {
  if (dtype == DType::F32) return device_nan(be, shape);
  Tensor t = Tensor::empty(shape, DType::BF16);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<uint16_t>()[i] = 0x7fc0;
  return be.upload(t);
}

// One backend's attention of the problem: its cache uploaded, store_kv, then attention twice
// (the second into a fresh poisoned output: the counters must be back at 0 for it).
struct GpuRun {
  Tensor out, again;
  uint64_t launches = 0;  // kernels the first attention call launched
};

GpuRun run_attention(CudaBackend& gpu, const Problem& pb, DType out_dtype) {
  KvCacheLayer cache{gpu.upload(pb.cpu_cache.k), gpu.upload(pb.cpu_cache.v)};
  gpu.prepare_batch(pb.batch);
  gpu.store_kv(gpu.upload(pb.k), gpu.upload(pb.v), pb.batch, cache);
  const Tensor q = gpu.upload(pb.q);
  const float scale = 1.0f / std::sqrt(static_cast<float>(pb.hd));
  const Shape shape = {pb.batch.num_tokens, static_cast<int64_t>(pb.hq) * pb.hd};
  GpuRun run;
  Tensor out = device_nan_of(gpu, shape, out_dtype);
  const uint64_t before = gpu.launch_counts().kernels;
  gpu.attention(q, cache, pb.batch, pb.hd, scale, out);
  run.launches = gpu.launch_counts().kernels - before;
  run.out = to_host(gpu, out);
  Tensor again = device_nan_of(gpu, shape, out_dtype);
  gpu.attention(q, cache, pb.batch, pb.hd, scale, again);
  run.again = to_host(gpu, again);
  return run;
}

// Whether a step splits its context: known from its shape (up to 32 positions never; a few
// rows at a long context always), or left to the card's SM count.
enum class Splits { kNo, kYes, kMaybe };

// Lever on against lever off (bit for bit, and one launch fewer where the step splits: the
// merge kernel's) and the CPU (an f32 output).
void check(DType cache_dtype, int hq, int hkv, int hd, const std::vector<SeqSpec>& seqs,
           uint32_t seed, int block_size, Splits splits, DType out_dtype = DType::F32) {
  SCOPED_TRACE("hq " + std::to_string(hq) + " hkv " + std::to_string(hkv) + " hd " +
               std::to_string(hd) + " block " + std::to_string(block_size) + " cache " +
               std::string(dtype_name(cache_dtype)) + " out " + std::string(dtype_name(out_dtype)) +
               " seqs " + std::to_string(seqs.size()) + " seed " + std::to_string(seed));
  const Problem pb = make_problem(hq, hkv, hd, block_size, cache_dtype, seqs, seed);
  CudaBackend off(0), on(0);
  off.set_attention_last_block_merge(false);
  on.set_attention_last_block_merge(true);
  const GpuRun want = run_attention(off, pb, out_dtype);
  const GpuRun got = run_attention(on, pb, out_dtype);
  EXPECT_TRUE(same_bytes(got.out, want.out)) << "lever on vs off";
  EXPECT_TRUE(same_bytes(got.again, got.out)) << "lever on, a second call";
  // Off, a split step adds the merge kernel (a step with a prefill chunk adds the tensor-core
  // kernel too, so count relative to off).
  const uint64_t saved = want.launches - got.launches;
  if (splits == Splits::kMaybe) {
    EXPECT_TRUE(saved == 0 || saved == 1) << saved << " launches saved";
  } else {
    EXPECT_EQ(saved, splits == Splits::kYes ? 1u : 0u) << "launches saved by the lever";
  }
  if (out_dtype != DType::F32) return;
  CpuBackend cpu(0);
  KvCacheLayer cpu_cache{clone_host(pb.cpu_cache.k), clone_host(pb.cpu_cache.v)};
  cpu.store_kv(pb.k, pb.v, pb.batch, cpu_cache);
  Tensor ref = Tensor::empty({pb.batch.num_tokens, static_cast<int64_t>(hq) * hd}, DType::F32);
  cpu.attention(pb.q, cpu_cache, pb.batch, hd, 1.0f / std::sqrt(static_cast<float>(hd)), ref);
  EXPECT_TRUE(close_to(got.out, ref, tolerance_for(pb.max_context))) << "lever on vs the CPU";
}

const DType kCacheDtypes[] = {DType::F32, DType::BF16};

// Qwen3-0.6B's attention at batch 1: contexts up to 32 never split (one split is at least
// kMinAttentionSplitLen positions), 33 and longer do.
TEST(CudaAttentionLastBlockMerge, Decode06bBatch1) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : kCacheDtypes) {
    for (int context : {1, 17, 32})
      check(dtype, 16, 8, 128, {{context - 1, 1}}, 700 + context, 16, Splits::kNo);
    for (int context : {33, 100, 1024, 4096})
      check(dtype, 16, 8, 128, {{context - 1, 1}}, 700 + context, 16, Splits::kYes);
  }
}

// Batch 8 with contexts of every kind (some rows use fewer splits than the plan, some one);
// batch 64 at context 1024 (512 CTAs: still split in two on a 132-SM card); decode rows beside
// a 64-row prefill chunk (the tensor-core kernel, and a row list for flash-decoding).
TEST(CudaAttentionLastBlockMerge, Decode06bBatches) {
  SKIP_WITHOUT_CUDA();
  const std::vector<SeqSpec> mixed = {{0, 1},  {16, 1}, {1023, 1}, {4095, 1},
                                      {99, 1}, {32, 1}, {1, 1},    {599, 1}};
  const std::vector<SeqSpec> batch64(64, SeqSpec{1023, 1});
  const std::vector<SeqSpec> with_prefill = {{1000, 64}, {499, 1}, {4095, 1}, {20, 1}};
  for (DType dtype : kCacheDtypes) {
    check(dtype, 16, 8, 128, mixed, 801, 16, Splits::kYes);
    check(dtype, 16, 8, 128, batch64, 802, 16, Splits::kMaybe);
    check(dtype, 16, 8, 128, with_prefill, 803, 16, Splits::kYes);
  }
  // A bf16 output (the rounding at the store), lever on vs off only.
  check(DType::BF16, 16, 8, 128, mixed, 804, 16, Splits::kYes, DType::BF16);
}

// The head layouts of CudaSanitizerSized.AttentionDecodeSplitAndUnsplit and more: groups of
// 1, 2, 3 (an idle head slot), 7, 16 (two CTAs per KV head: two counters per row); hd 256 f32
// (two loads per lane), 80 and 6 (scalar loads), 64; block sizes 1, 3, 8; chunk rows.
TEST(CudaAttentionLastBlockMerge, SmallShapes) {
  SKIP_WITHOUT_CUDA();
  const std::vector<SeqSpec> mixed = {{99, 1}, {3, 1}, {40, 5}};
  for (DType dtype : kCacheDtypes) {
    check(dtype, 4, 2, 64, {{99, 1}}, 901, 16, Splits::kYes);
    check(dtype, 4, 2, 64, {{19, 1}}, 902, 16, Splits::kNo);
    check(dtype, 6, 2, 64, mixed, 903, 16, Splits::kYes);
    check(dtype, 2, 2, 128, mixed, 904, 16, Splits::kYes);
    check(dtype, 16, 1, 128, {{70, 1}}, 905, 16, Splits::kYes);
    check(dtype, 14, 2, 64, mixed, 906, 16, Splits::kYes);
    check(dtype, 4, 2, 6, mixed, 907, 3, Splits::kYes);
    check(dtype, 6, 2, 80, mixed, 908, 1, Splits::kYes);
  }
  check(DType::F32, 8, 2, 256, {{50, 1}, {0, 2}}, 909, 16, Splits::kYes);
}

// Sanitizer-sized (docs/RELIABILITY.md "GPU sanitizers"; racecheck_attention, synccheck and
// initcheck run it): the last-block merge's instances at the smallest shapes reaching its
// paths (16 launches): f32 cache, 2 heads per CTA, 4 splits of 25 (a counter per KV head of
// the row); bf16 cache, a group of 16 (two 8-head CTAs per KV head: two counters), a row of one
// split (no counter) beside a split row.
TEST(CudaSanitizerSized, AttentionLastBlockMerge) {
  SKIP_WITHOUT_CUDA();
  check(DType::F32, 4, 2, 64, {{99, 1}}, 1201, 16, Splits::kYes);
  check(DType::BF16, 16, 1, 128, {{70, 1}, {3, 1}}, 1202, 16, Splits::kYes);
}

// The kernel launched directly with forced split counts, as CudaFlashAttention's split test
// does, with and without counters: the same bits, and every counter back at 0.
TEST(CudaAttentionLastBlockMerge, ForcedSplitCountsAndCountersReset) {
  SKIP_WITHOUT_CUDA();
  const std::vector<SeqSpec> seqs = {{4095, 1}, {1000, 37}, {16, 1}, {0, 1}, {511, 1}};
  for (DType dtype : kCacheDtypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Problem pb = make_problem(16, 8, 128, 16, dtype, seqs, 1001);
    CudaBackend gpu(0);
    KvCacheLayer cache{gpu.upload(pb.cpu_cache.k), gpu.upload(pb.cpu_cache.v)};
    gpu.prepare_batch(pb.batch);
    gpu.store_kv(gpu.upload(pb.k), gpu.upload(pb.v), pb.batch, cache);
    const int T = pb.batch.num_tokens, S = pb.batch.num_seqs();
    int max_blocks = 1;
    for (const auto& table : pb.batch.block_tables)
      max_blocks = std::max(max_blocks, static_cast<int>(table.size()));
    Tensor pos = Tensor::empty({T}, DType::I32), seq = Tensor::empty({T}, DType::I32);
    Tensor tab = Tensor::empty({S, max_blocks}, DType::I32);
    std::fill(tab.ptr<int32_t>(), tab.ptr<int32_t>() + tab.numel(), 0);
    for (int s = 0; s < S; ++s) {
      for (int t = pb.batch.query_start[s]; t < pb.batch.query_start[s + 1]; ++t) {
        pos.ptr<int32_t>()[t] = pb.batch.positions[t];
        seq.ptr<int32_t>()[t] = s;
      }
      const auto& table = pb.batch.block_tables[s];
      std::copy(table.begin(), table.end(), tab.ptr<int32_t>() + s * max_blocks);
    }
    const Tensor q = gpu.upload(pb.q), positions = gpu.upload(pos), seq_of_token = gpu.upload(seq),
                 block_table = gpu.upload(tab);
    const int64_t capacity = static_cast<int64_t>(T) * pb.hkv;  // group 2: one column per KV head
    Tensor zeros = Tensor::empty({capacity}, DType::I32);
    std::fill(zeros.ptr<int32_t>(), zeros.ptr<int32_t>() + capacity, 0);
    Tensor counters = gpu.upload(zeros);
    auto run = [&](int num_splits, int split_len, bool merge_last) {
      Tensor out = device_nan(gpu, {T, pb.hq * pb.hd});
      cuda::PagedAttentionArgs a;
      a.q = q.ptr<float>();
      a.k_cache = cache.k.data;
      a.v_cache = cache.v.data;
      a.kv_dtype = cache.k.dtype;
      a.positions = positions.ptr<int32_t>();
      a.seq_of_token = seq_of_token.ptr<int32_t>();
      a.block_table = block_table.ptr<int32_t>();
      a.max_blocks = max_blocks;
      a.num_tokens = T;
      a.hq = pb.hq;
      a.hkv = pb.hkv;
      a.head_dim = pb.hd;
      a.block_size = pb.block_size;
      a.scale = 1.0f / std::sqrt(static_cast<float>(pb.hd));
      a.out = out.ptr<float>();
      a.num_splits = num_splits;
      a.split_len = split_len;
      cuda::AttentionSplitCounters merge;
      if (merge_last) merge = {counters.ptr<int32_t>(), capacity};
      EXPECT_EQ(cuda::attention_split_counters_needed(a), num_splits > 1 ? capacity : 0);
      Tensor partials;
      if (const int64_t floats = cuda::attention_partial_floats(a); floats > 0) {
        partials = gpu.alloc({floats}, DType::F32);
        a.partials = partials.ptr<float>();
      }
      const uint64_t before = gpu.launch_counts().kernels;
      cuda::launch_paged_attention(a, merge, gpu.stream());
      const uint64_t launches = gpu.launch_counts().kernels - before;
      EXPECT_EQ(launches, num_splits > 1 && !merge_last ? 2u : 1u) << num_splits << " splits";
      return to_host(gpu, out);  // waits for the stream: partials may die after
    };
    const int context = pb.max_context;  // 4096
    std::vector<std::pair<int, int>> plans = {{4, 100}};
    for (int splits : {2, 3, 17, 64, cuda::kMaxAttentionSplits})
      plans.push_back({splits, (context + splits - 1) / splits});
    for (const auto& [splits, len] : plans) {
      SCOPED_TRACE(std::to_string(splits) + " splits of " + std::to_string(len));
      const Tensor want = run(splits, len, false);
      EXPECT_TRUE(same_bytes(run(splits, len, true), want)) << "lever on vs off";
      EXPECT_TRUE(same_bytes(to_host(gpu, counters), zeros)) << "counters after the launch";
    }
  }
}

// The op captured into a graph with the lever on, replayed twice into an output poisoned
// before each replay: the lever-off eager bits both times (a counter left above 0 by the
// first replay would leave heads unmerged, NaN, in the second).
TEST(CudaAttentionLastBlockMerge, GraphReplayedTwice) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : kCacheDtypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    const Problem pb = make_problem(16, 8, 128, 16, dtype, {{1023, 1}, {99, 1}, {10, 1}}, 1101);
    CudaBackend off(0);
    off.set_attention_last_block_merge(false);
    const GpuRun want = run_attention(off, pb, DType::F32);

    CudaBackend on(0);
    on.set_attention_last_block_merge(true);
    KvCacheLayer cache{on.upload(pb.cpu_cache.k), on.upload(pb.cpu_cache.v)};
    on.prepare_batch(pb.batch);
    on.store_kv(on.upload(pb.k), on.upload(pb.v), pb.batch, cache);
    const Tensor q = on.upload(pb.q);
    const Shape shape = {pb.batch.num_tokens, static_cast<int64_t>(pb.hq) * pb.hd};
    const Tensor poison = device_nan(on, shape);
    Tensor out = device_nan(on, shape);
    const float scale = 1.0f / std::sqrt(static_cast<float>(pb.hd));
    std::unique_ptr<CudaGraph> graph =
        on.capture_graph([&] { on.attention(q, cache, pb.batch, pb.hd, scale, out); });
    for (int replay = 0; replay < 2; ++replay) {
      on.copy(poison, out);
      graph->replay();
      EXPECT_TRUE(same_bytes(to_host(on, out), want.out)) << "replay " << replay;
    }
  }
}

// Prefills of 40 and 70 tokens (flash-decoding chunks: under 64 rows) then decode steps: every
// step's logits bit for bit with the lever on and off.
void compare_model(const ModelConfig& config, DType weight_dtype) {
  LeverModelRun run;
  run.prompts = {40, 70};
  run.num_blocks = 40;
  run.weight_seed = 12;
  run.token_seed = 6;
  expect_lever_keeps_logits(
      config, weight_dtype, [](CudaBackend& be, bool on) { be.set_attention_last_block_merge(on); },
      run);
}

TEST(CudaAttentionLastBlockMerge, ModelLogitsEqualTheLeverOff) {
  SKIP_WITHOUT_CUDA();
  for (DType wdt : {DType::BF16, DType::F32}) {
    compare_model(small_config("", 2, 0), wdt);
    compare_model(small_config("block", 4, 2), wdt);
  }
}

TEST(CudaAttentionLastBlockMerge, EnvironmentSwitchesTheLeverWhenABackendIsBuilt) {
  SKIP_WITHOUT_CUDA();
  expect_environment_switches_lever(
      "ATTNRES_CUDA_ATTN_LAST_BLOCK_MERGE",
      [](const CudaBackend& be) { return be.attention_last_block_merge(); },
      [](CudaBackend& be, bool on) { be.set_attention_last_block_merge(on); });
}

// Host only: the counters a launch needs and the bound that covers every split plan.
TEST(CudaAttentionLastBlockMerge, CounterBoundCoversEverySplitPlan) {
  constexpr int kSms = 132;
  for (int hq : {2, 14, 16, 32})
    for (int hkv : {1, 2, 8})
      for (int64_t tokens : {1, 3, 8, 64, 100})
        for (int context : {1, 33, 1024, 4096}) {
          if (hq % hkv != 0) continue;
          const cuda::AttentionSplitPlan plan =
              cuda::plan_attention_splits(tokens, hq, hkv, context, kSms);
          cuda::PagedAttentionArgs a;
          a.num_tokens = tokens;
          a.hq = hq;
          a.hkv = hkv;
          a.num_splits = plan.num_splits;
          const int64_t needed = cuda::attention_split_counters_needed(a);
          if (plan.num_splits == 1) {
            EXPECT_EQ(needed, 0);
          } else {
            EXPECT_GT(needed, 0);
            EXPECT_LE(needed, cuda::attention_split_counter_bound(kSms))
                << tokens << " tokens, " << hq << " / " << hkv << " heads, context " << context;
          }
        }
}

}  // namespace
}  // namespace attnres::test
