// The CUDA flash-decoding attention (cuda_attention.cu) and store_kv at real shapes, against
// the CPU backend (the oracle), with F32 and BF16 caches.
//
// Tolerance (|got - ref| <= rtol |ref| + rtol * rms(ref), NaN never passes): rtol 2e-5 up to
// context 1024, 4e-5 at 4096. Both backends sum in f32 in different orders (the CPU an exact
// two-pass softmax, the GPU online softmax per key group merged across warps and splits); the
// rounding of a sum of n terms of random sign grows like sqrt(n), ~3e-6 of the output's rms
// at n = 4096. A bf16 cache holds the same bits on both (store_kv is checked bit for bit), so
// its attention has the f32 cache's tolerance.
//
// Host-only tests (CudaAttentionPlan.*) check the split plan and the dtype traits and run
// without a GPU; the rest skip without one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/core/backend_registry.h"
#include "engine/core/error.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/cuda/cuda_registration.h"
#include "tests/cpp/kernels/cuda/cuda_test_util.h"
#include "tests/cpp/kernels/cuda/paged_batch_util.h"

namespace attnres::test {
namespace {

constexpr int kH100Sms = 132;

// --- the split plan (host) ---

TEST(CudaAttentionPlan, HeadsPerCtaCoverTheGroup) {
  EXPECT_EQ(cuda::attention_heads_per_cta(1), 1);
  EXPECT_EQ(cuda::attention_heads_per_cta(2), 2);
  EXPECT_EQ(cuda::attention_heads_per_cta(3), 4);
  EXPECT_EQ(cuda::attention_heads_per_cta(7), 8);
  EXPECT_EQ(cuda::attention_heads_per_cta(8), 8);
  EXPECT_EQ(cuda::attention_heads_per_cta(16), 8);  // two CTAs per KV head
}

TEST(CudaAttentionPlan, SplitsCoverTheContextAndFillTheGpu) {
  struct Case {
    int64_t tokens;
    int hq, hkv, context;
  };
  for (const Case& c : std::vector<Case>{{1, 16, 8, 1},
                                         {1, 16, 8, 17},
                                         {1, 16, 8, 1024},
                                         {1, 16, 8, 4096},
                                         {1, 16, 8, 1 << 20},
                                         {64, 16, 8, 1024},
                                         {64, 16, 8, 4096},
                                         {2048, 16, 8, 2048},
                                         {1, 16, 16, 33},
                                         {3, 16, 1, 999}}) {
    SCOPED_TRACE("tokens " + std::to_string(c.tokens) + " hq " + std::to_string(c.hq) + " hkv " +
                 std::to_string(c.hkv) + " context " + std::to_string(c.context));
    const cuda::AttentionSplitPlan plan =
        cuda::plan_attention_splits(c.tokens, c.hq, c.hkv, c.context, kH100Sms);
    ASSERT_GE(plan.num_splits, 1);
    ASSERT_LE(plan.num_splits, cuda::kMaxAttentionSplits);
    // Every position in exactly one split: the splits reach the context, none is empty.
    EXPECT_GE(static_cast<int64_t>(plan.num_splits) * plan.split_len, c.context);
    EXPECT_LT(static_cast<int64_t>(plan.num_splits - 1) * plan.split_len, c.context);
    const int group = c.hq / c.hkv, heads = cuda::attention_heads_per_cta(group);
    const int64_t ctas = c.tokens * c.hkv * ((group + heads - 1) / heads);
    if (c.context <= cuda::kMinAttentionSplitLen) {
      EXPECT_EQ(plan.num_splits, 1);
    }
    if (ctas >= 4 * kH100Sms) {
      EXPECT_EQ(plan.num_splits, 1);  // the batch fills the GPU alone
    }
    if (c.context >= 1024 && plan.num_splits < cuda::kMaxAttentionSplits) {
      EXPECT_GE(ctas * plan.num_splits, kH100Sms);  // a long context is split to cover every SM
    }
  }
  // Batch 1 at context 1024 (0.6B: 8 KV heads): 8 CTAs without splits, 132 SMs; 32 splits of
  // 32 positions make 256 CTAs, all resident at once (4 per SM fit).
  const cuda::AttentionSplitPlan b1 = cuda::plan_attention_splits(1, 16, 8, 1024, kH100Sms);
  EXPECT_EQ(b1.num_splits, 32);
  EXPECT_EQ(b1.split_len, 32);
}

TEST(CudaAttentionPlan, TheCudaBackendTakesABf16Cache) {
  EXPECT_TRUE(cuda_backend_capabilities().kv_cache_dtypes.contains(DType::F32));
  EXPECT_TRUE(cuda_backend_capabilities().kv_cache_dtypes.contains(DType::BF16));
  EXPECT_FALSE(cuda_backend_capabilities().kv_cache_dtypes.contains(DType::F16));
  register_cuda_backend();  // the traits --kv-cache-dtype auto reads before a GPU is touched
  const BackendTraits traits = backend_traits("cuda");
  EXPECT_TRUE(traits.capabilities.kv_cache_dtypes.contains(DType::BF16));
  EXPECT_FALSE(traits.capabilities.kv_cache_dtypes.contains(DType::F16));
}

// --- problems at real shapes ---

// Uniform(-1, 1) values stored as `dtype` (F32 or BF16, rounded as f32_to_bf16).
Tensor random_cache(const Shape& shape, DType dtype, std::mt19937& rng) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t n = t.numel();
  if (dtype == DType::BF16) {
    for (int64_t i = 0; i < n; ++i) t.ptr<uint16_t>()[i] = f32_to_bf16(dist(rng));
  } else {
    for (int64_t i = 0; i < n; ++i) t.ptr<float>()[i] = dist(rng);
  }
  return t;
}

// One step's batch over a paged cache: every sequence's blocks drawn at random from a
// shuffled pool (non-contiguous tables), the whole cache random (the cached prefixes are
// "already there"; slots nobody writes must stay as they were), this step's q, k, v random.
struct AttentionProblem {
  int hq = 0, hkv = 0, hd = 0, block_size = 16;
  BatchMeta batch;
  Tensor q, k, v;          // host f32
  KvCacheLayer cpu_cache;  // host
  int max_context = 0;
};

AttentionProblem make_problem(int hq, int hkv, int hd, int block_size, DType cache_dtype,
                              const std::vector<SeqSpec>& seqs, uint32_t seed) {
  AttentionProblem pb;
  pb.hq = hq;
  pb.hkv = hkv;
  pb.hd = hd;
  pb.block_size = block_size;
  std::mt19937 rng(seed);
  int num_blocks = 3;  // a few nobody uses
  for (const SeqSpec& s : seqs) num_blocks += (s.cached + s.chunk + block_size - 1) / block_size;
  pb.batch = paged_batch(seqs, block_size, num_blocks, rng);
  const int T = pb.batch.num_tokens;
  for (const SeqSpec& s : seqs) pb.max_context = std::max(pb.max_context, s.cached + s.chunk);
  pb.cpu_cache.k = random_cache({num_blocks, block_size, hkv, hd}, cache_dtype, rng);
  pb.cpu_cache.v = random_cache({num_blocks, block_size, hkv, hd}, cache_dtype, rng);
  pb.k = random_host({T, hkv * hd}, DType::F32, rng);
  pb.v = random_host({T, hkv * hd}, DType::F32, rng);
  pb.q = random_host({T, hq * hd}, DType::F32, rng);
  return pb;
}

double tolerance_for(int max_context) { return max_context > 1024 ? 4e-5 : 2e-5; }

// store_kv on both backends (bit for bit), then attention (within tolerance_for).
void check_against_cpu(DType cache_dtype, int hq, int hkv, int hd, const std::vector<SeqSpec>& seqs,
                       uint32_t seed, int block_size = 16) {
  SCOPED_TRACE("hq " + std::to_string(hq) + " hkv " + std::to_string(hkv) + " hd " +
               std::to_string(hd) + " block " + std::to_string(block_size) + " cache " +
               std::string(dtype_name(cache_dtype)) + " seqs " + std::to_string(seqs.size()));
  AttentionProblem pb = make_problem(hq, hkv, hd, block_size, cache_dtype, seqs, seed);
  CpuBackend cpu(0);
  CudaBackend gpu(0);
  KvCacheLayer gpu_cache{gpu.upload(pb.cpu_cache.k), gpu.upload(pb.cpu_cache.v)};
  gpu.prepare_batch(pb.batch);
  cpu.store_kv(pb.k, pb.v, pb.batch, pb.cpu_cache);
  gpu.store_kv(gpu.upload(pb.k), gpu.upload(pb.v), pb.batch, gpu_cache);
  EXPECT_TRUE(same_bytes(to_host(gpu, gpu_cache.k), pb.cpu_cache.k)) << "store_kv k";
  EXPECT_TRUE(same_bytes(to_host(gpu, gpu_cache.v), pb.cpu_cache.v)) << "store_kv v";

  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int T = pb.batch.num_tokens;
  Tensor ref = Tensor::empty({T, hq * hd}, DType::F32);
  cpu.attention(pb.q, pb.cpu_cache, pb.batch, hd, scale, ref);
  Tensor out = device_nan(gpu, {T, hq * hd});
  gpu.attention(gpu.upload(pb.q), gpu_cache, pb.batch, hd, scale, out);
  const Tensor got = to_host(gpu, out);
  EXPECT_TRUE(close_to(got, ref, tolerance_for(pb.max_context)))
      << "attention, max context " << pb.max_context;

  // Deterministic: the same step again gives the same bits.
  Tensor again = device_nan(gpu, {T, hq * hd});
  gpu.attention(gpu.upload(pb.q), gpu_cache, pb.batch, hd, scale, again);
  EXPECT_TRUE(same_bytes(to_host(gpu, again), got)) << "a second run differs";
}

const DType kCacheDtypes[] = {DType::F32, DType::BF16};

// Qwen3-0.6B's attention: hd 128, 16 query heads on 8 KV heads.
TEST(CudaFlashAttention, DecodeBatch1AtRealContexts) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : kCacheDtypes)
    for (int context : {1, 17, 1024, 4096})
      check_against_cpu(dtype, 16, 8, 128, {{context - 1, 1}}, 100 + context);
}

TEST(CudaFlashAttention, DecodeBatch64) {
  SKIP_WITHOUT_CUDA();
  std::vector<SeqSpec> same(64, SeqSpec{1023, 1});  // context 1024 each
  std::vector<SeqSpec> mixed;
  const int contexts[] = {1, 17, 1024, 4096};
  for (int s = 0; s < 64; ++s) mixed.push_back({contexts[s % 4] - 1, 1});
  for (DType dtype : kCacheDtypes) {
    check_against_cpu(dtype, 16, 8, 128, same, 201);
    check_against_cpu(dtype, 16, 8, 128, mixed, 202);
  }
}

// Prefill chunks (37 tokens after a cached prefix, and from scratch) in one batch with decode
// rows: every query token attends to its own causal prefix through the block table.
TEST(CudaFlashAttention, MixedPrefillAndDecode) {
  SKIP_WITHOUT_CUDA();
  const std::vector<SeqSpec> seqs = {{1000, 37}, {4, 1},  {0, 37},   {1023, 1},
                                     {4095, 1},  {16, 1}, {200, 37}, {63, 1}};
  for (DType dtype : kCacheDtypes) check_against_cpu(dtype, 16, 8, 128, seqs, 301);
}

// Other head layouts: Hq = Hkv, hd 64, a group of 7 (a partly used CTA), 16 (two CTAs per KV
// head), hd 256 in f32 (two 16-byte loads per lane), hd 80 and hd 6 (scalar loads in f32 /
// bf16 where a row is not whole 16-byte vectors), block sizes other than 16.
TEST(CudaFlashAttention, HeadLayouts) {
  SKIP_WITHOUT_CUDA();
  const std::vector<SeqSpec> decode_1024 = {{1023, 1}};
  const std::vector<SeqSpec> mixed = {{300, 5}, {0, 1}, {40, 1}, {16, 3}};
  for (DType dtype : kCacheDtypes) {
    check_against_cpu(dtype, 16, 16, 128, decode_1024, 401);
    check_against_cpu(dtype, 16, 16, 128, mixed, 402);
    check_against_cpu(dtype, 16, 8, 64, decode_1024, 403);
    check_against_cpu(dtype, 16, 8, 64, mixed, 404);
    check_against_cpu(dtype, 14, 2, 64, mixed, 405);
    check_against_cpu(dtype, 32, 2, 128, decode_1024, 406);
    check_against_cpu(dtype, 8, 2, 256, mixed, 407);
    check_against_cpu(dtype, 6, 2, 80, mixed, 408, 8);
    check_against_cpu(dtype, 4, 2, 6, mixed, 409, 3);
    check_against_cpu(dtype, 16, 8, 128, mixed, 410, 1);
  }
}

// Sanitizer-sized (docs/RELIABILITY.md "GPU sanitizers"): paged_attention_kernel and the
// split merge at the smallest shapes reaching each path, through the backend's plan (a
// context over kMinAttentionSplitLen = 32 on a batch far from filling the GPU splits: 99
// positions in 4 splits of 25, then merge_attention_splits_kernel; 20 does not). Each case
// names the path it adds:
TEST(CudaSanitizerSized, AttentionDecodeSplitAndUnsplit) {
  SKIP_WITHOUT_CUDA();
  const std::vector<SeqSpec> mixed = {{99, 1}, {3, 1}, {40, 5}};  // short rows in a split plan
  // f32 cache, 2 query heads per CTA, 16 lanes per key, split + merge.
  check_against_cpu(DType::F32, 4, 2, 64, {{99, 1}}, 601);
  // bf16 cache, 8 lanes per key, one split (no merge).
  check_against_cpu(DType::BF16, 4, 2, 64, {{19, 1}}, 602);
  // A group of 3 in a 4-head CTA (one head slot idle); a 5-row chunk and rows whose context
  // fits one split in a split plan.
  check_against_cpu(DType::BF16, 6, 2, 64, mixed, 603);
  // A group of 1 (Hq = Hkv), hd 128.
  check_against_cpu(DType::F32, 2, 2, 128, mixed, 604);
  // A group of 16: two 8-head CTAs per KV head, split.
  check_against_cpu(DType::BF16, 16, 1, 128, {{70, 1}}, 605);
  // f32 hd 256: two 16-byte loads per lane (64 vectors).
  check_against_cpu(DType::F32, 8, 2, 256, {{50, 1}, {0, 2}}, 606);
  // Scalar loads (hd 6), block size 3.
  check_against_cpu(DType::BF16, 4, 2, 6, mixed, 607, 3);
  // hd 80: f32 20 vectors on 32 lanes (12 idle), block size 1; bf16 10 vectors on 16 lanes.
  check_against_cpu(DType::F32, 6, 2, 80, mixed, 608, 1);
  check_against_cpu(DType::BF16, 6, 2, 80, {{99, 1}}, 609, 8);
}

// --- the split count ---

// Runs the attention kernel directly with a forced split, on a problem whose store_kv already
// ran (the GPU cache holds the step's rows).
struct DirectAttention {
  CudaBackend gpu{0};
  AttentionProblem pb;
  KvCacheLayer cache;
  Tensor q, positions, seq_of_token, block_table;
  int max_blocks = 1;

  DirectAttention(DType cache_dtype, const std::vector<SeqSpec>& seqs, uint32_t seed)
      : pb(make_problem(16, 8, 128, 16, cache_dtype, seqs, seed)) {
    cache = KvCacheLayer{gpu.upload(pb.cpu_cache.k), gpu.upload(pb.cpu_cache.v)};
    gpu.prepare_batch(pb.batch);
    gpu.store_kv(gpu.upload(pb.k), gpu.upload(pb.v), pb.batch, cache);
    q = gpu.upload(pb.q);
    const int T = pb.batch.num_tokens, S = pb.batch.num_seqs();
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
    positions = gpu.upload(pos);
    seq_of_token = gpu.upload(seq);
    block_table = gpu.upload(tab);
  }

  Tensor run(int num_splits, int split_len) {
    const int T = pb.batch.num_tokens;
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
    Tensor partials;
    if (const int64_t floats = cuda::attention_partial_floats(a); floats > 0) {
      partials = gpu.alloc({floats}, DType::F32);
      a.partials = partials.ptr<float>();
    }
    cuda::launch_paged_attention(a, gpu.stream());
    return to_host(gpu, out);  // waits for the stream: partials may die after
  }
};

// Every split count gives the one-split result within f32 rounding (and the CPU's within the
// stated tolerance), including a plan whose splits are too short for the longest context (its
// last split runs to the end of the context).
TEST(CudaFlashAttention, SplitCountDoesNotChangeTheResult) {
  SKIP_WITHOUT_CUDA();
  const std::vector<SeqSpec> seqs = {{4095, 1}, {1000, 37}, {16, 1}, {0, 1}, {511, 1}};
  for (DType dtype : kCacheDtypes) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    DirectAttention run(dtype, seqs, 501);
    CpuBackend cpu(0);
    Tensor ref = Tensor::empty({run.pb.batch.num_tokens, run.pb.hq * run.pb.hd}, DType::F32);
    cpu.store_kv(run.pb.k, run.pb.v, run.pb.batch, run.pb.cpu_cache);
    cpu.attention(run.pb.q, run.pb.cpu_cache, run.pb.batch, run.pb.hd,
                  1.0f / std::sqrt(static_cast<float>(run.pb.hd)), ref);
    const int context = run.pb.max_context;  // 4096
    const Tensor one = run.run(1, context);
    EXPECT_TRUE(close_to(one, ref, tolerance_for(context))) << "1 split";
    for (int splits : {2, 3, 17, 64, cuda::kMaxAttentionSplits}) {
      const int len = (context + splits - 1) / splits;
      EXPECT_TRUE(close_to(run.run(splits, len), one, 2e-5)) << splits << " splits of " << len;
    }
    EXPECT_TRUE(close_to(run.run(4, 100), one, 2e-5)) << "4 splits of 100 (last to the end)";
    EXPECT_TRUE(close_to(run.run(1, 7), one, 2e-5)) << "1 split of 7 (runs to the end)";
  }
}

// --- store_kv's bf16 rounding on the values that decide it ---

TEST(CudaFlashAttention, StoreKvBf16RoundsLikeTheCpu) {
  SKIP_WITHOUT_CUDA();
  const uint32_t specials[] = {
      0x00000000u, 0x80000000u,  // +-0
      0x3f808000u, 0x3f818000u,  // ties: to even (down, then up)
      0x3f808001u, 0x3f807fffu,  // just above / below a tie
      0x7f7fffffu, 0xff7fffffu,  // the largest finite: rounds to +-inf
      0x7f800000u, 0xff800000u,  // +-inf
      0x7fc00000u, 0xffc00001u,  // quiet NaNs (one negative, with payload)
      0x7f800001u, 0x7fa00000u,  // signalling NaNs: quieted, not made inf
      0x00000001u, 0x807fffffu,  // denormals (kept, not flushed)
      0x00008000u, 0x00018000u,  // denormal ties
  };
  const int n_special = static_cast<int>(sizeof(specials) / sizeof(specials[0]));
  const int hkv = 2, hd = 24, row = hkv * hd, T = 5;  // 240 values: every special, then random
  std::mt19937 rng(601);
  Tensor k = random_host({T, row}, DType::F32, rng, -3.0f, 3.0f);
  Tensor v = random_host({T, row}, DType::F32, rng, -3.0f, 3.0f);
  for (int i = 0; i < n_special; ++i) {
    std::memcpy(k.ptr<float>() + i, &specials[i], 4);
    std::memcpy(v.ptr<float>() + T * row - 1 - i, &specials[i], 4);
  }
  BatchMeta batch;
  batch.num_tokens = T;
  batch.query_start = {0, T};
  batch.context_len = {T};
  batch.block_tables = {{1, 0}};
  for (int t = 0; t < T; ++t) {
    batch.token_ids.push_back(1);
    batch.positions.push_back(t);
    batch.slot_mapping.push_back(batch.block_tables[0][t / 4] * 4 + t % 4);
  }
  CpuBackend cpu(1);
  CudaBackend gpu(0);
  KvCacheLayer cpu_cache{random_cache({2, 4, hkv, hd}, DType::BF16, rng),
                         random_cache({2, 4, hkv, hd}, DType::BF16, rng)};
  KvCacheLayer gpu_cache{gpu.upload(cpu_cache.k), gpu.upload(cpu_cache.v)};
  cpu.store_kv(k, v, batch, cpu_cache);
  gpu.store_kv(gpu.upload(k), gpu.upload(v), batch, gpu_cache);
  const Tensor got_k = to_host(gpu, gpu_cache.k), got_v = to_host(gpu, gpu_cache.v);
  EXPECT_TRUE(same_bytes(got_k, cpu_cache.k));
  EXPECT_TRUE(same_bytes(got_v, cpu_cache.v));
  // And against the scalar definition directly (the CPU's SIMD store claims the same).
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < row; ++i) {
      const int64_t slot = batch.slot_mapping[t];
      ASSERT_EQ(got_k.ptr<uint16_t>()[slot * row + i], f32_to_bf16(k.ptr<float>()[t * row + i]))
          << "k token " << t << " element " << i;
      ASSERT_EQ(got_v.ptr<uint16_t>()[slot * row + i], f32_to_bf16(v.ptr<float>()[t * row + i]))
          << "v token " << t << " element " << i;
    }
}

TEST(CudaFlashAttention, RefusesCachesItCannotRead) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu(0);
  BatchMeta batch;
  batch.num_tokens = 1;
  batch.token_ids = {1};
  batch.positions = {0};
  batch.slot_mapping = {0};
  batch.query_start = {0, 1};
  batch.context_len = {1};
  batch.block_tables = {{0}};
  Tensor k = gpu.alloc({1, 64}, DType::F32), q = gpu.alloc({1, 128}, DType::F32);
  Tensor out = gpu.alloc({1, 128}, DType::F32);
  KvCacheLayer f16{gpu.alloc({1, 16, 1, 64}, DType::F16), gpu.alloc({1, 16, 1, 64}, DType::F16)};
  KvCacheLayer mixed{gpu.alloc({1, 16, 1, 64}, DType::F32), gpu.alloc({1, 16, 1, 64}, DType::BF16)};
  // A bug of the caller, not bad input (the engine sizes its cache from
  // kv_cache_dtypes): the internal error that names the dtypes, as on the CPU.
  for (KvCacheLayer* cache : {&f16, &mixed}) {
    EXPECT_THROW(gpu.store_kv(k, k, batch, *cache), std::logic_error);
    EXPECT_THROW(gpu.attention(q, *cache, batch, 64, 0.125f, out), std::logic_error);
  }
}

}  // namespace
}  // namespace attnres::test
