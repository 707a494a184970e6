// The CPU backend's bf16 KV cache (--kv-cache-dtype bfloat16): store_kv rounds K/V to bf16
// (nearest even, as f32_to_bf16), and attention over that cache equals attention over an f32
// cache holding the same K/V pre-rounded to bf16 (the kernels widen in registers with the
// same loops, so up to f32 summation order; in practice bit for bit). Also the cache sizing:
// a bf16 block takes half the bytes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "engine/model/kv_cache.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/kernels/cpu/paged_kv_steps.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres::test {
namespace {

float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Random f32 values with all 32 bits in use (not already representable in bf16).
Tensor random_f32(const Shape& shape, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::empty(shape, DType::F32);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = dist(rng);
  return t;
}

Tensor rounded_copy(const Tensor& t) {
  Tensor r = Tensor::empty(t.shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) r.ptr<float>()[i] = round_bf16(t.ptr<float>()[i]);
  return r;
}

// Runs the same two steps (a prefix step, then the step under test: prefill chunks after a
// cached prefix and decodes) on a cache of `dtype`, with K/V `k_all`, `v_all` per sequence, and
// returns the attention output of the second step.
Tensor run_attention(Backend& be, DType dtype, int hq, int hkv, int hd, int block_size,
                     const std::vector<SeqSpec>& seqs,
                     const std::vector<std::vector<int32_t>>& tables,
                     const std::vector<Tensor>& k_all, const std::vector<Tensor>& v_all,
                     const Tensor& q, int num_blocks) {
  const int row = hkv * hd, ns = static_cast<int>(seqs.size());
  KvCacheLayer cache{be.alloc({num_blocks, block_size, hkv, hd}, dtype),
                     be.alloc({num_blocks, block_size, hkv, hd}, dtype)};
  auto slot = [&](int s, int p) { return tables[s][p / block_size] * block_size + p % block_size; };
  store_paged_step(be, seqs, tables, block_size, row, k_all, v_all, cache, true);
  const BatchMeta batch =
      store_paged_step(be, seqs, tables, block_size, row, k_all, v_all, cache, false);
  Tensor out = be.alloc({batch.num_tokens, hq * hd}, DType::F32);
  be.attention(q, cache, batch, hd, 1.0f / std::sqrt(static_cast<float>(hd)), out);

  if (dtype == DType::BF16) {  // what store_kv wrote: every K/V element rounded to nearest even
    for (int s = 0; s < ns; ++s)
      for (int p = 0; p < seqs[s].cached + seqs[s].chunk; ++p)
        for (int i = 0; i < row; ++i) {
          const int64_t at = static_cast<int64_t>(slot(s, p)) * row + i;
          EXPECT_EQ(cache.k.ptr<uint16_t>()[at], f32_to_bf16(k_all[s].ptr<float>()[p * row + i]));
          EXPECT_EQ(cache.v.ptr<uint16_t>()[at], f32_to_bf16(v_all[s].ptr<float>()[p * row + i]));
        }
  }
  return out;
}

// Per output element, sum_p w_p |v[p]| (double, softmax weights w) over the step's tokens
// (those after each sequence's cached prefix): the scale of the attention sum.
std::vector<double> magnitudes(const std::vector<SeqSpec>& seqs, const std::vector<Tensor>& k_all,
                               const std::vector<Tensor>& v_all, const Tensor& q, int hq, int hkv,
                               int hd) {
  const int row = hkv * hd;
  const auto qv = values(q);
  std::vector<double> mag(qv.size());
  int t = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto kv = values(k_all[s]), vv = values(v_all[s]);
    for (int pos = seqs[s].cached; pos < seqs[s].cached + seqs[s].chunk; ++pos, ++t)
      for (int h = 0; h < hq; ++h) {
        const int kvh = h / (hq / hkv), ctx = pos + 1;
        std::vector<double> sc(ctx);
        for (int p = 0; p < ctx; ++p) {
          double d = 0;
          for (int i = 0; i < hd; ++i) d += qv[(t * hq + h) * hd + i] * kv[p * row + kvh * hd + i];
          sc[p] = d / std::sqrt(static_cast<double>(hd));
        }
        const double mx = *std::max_element(sc.begin(), sc.end());
        double den = 0;
        for (double& x : sc) den += (x = std::exp(x - mx));
        for (int i = 0; i < hd; ++i) {
          double acc = 0;
          for (int p = 0; p < ctx; ++p) acc += sc[p] * std::fabs(vv[p * row + kvh * hd + i]);
          mag[(t * hq + h) * hd + i] = acc / den;
        }
      }
  }
  return mag;
}

void check_bf16_cache(int hq, int hkv, int hd, int block_size, const std::vector<SeqSpec>& seqs,
                      uint32_t seed) {
  auto be = make_cpu_backend(3);
  std::mt19937 rng(seed);
  const int num_blocks = 64, row = hkv * hd, ns = static_cast<int>(seqs.size());
  std::vector<int> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);  // non-contiguous tables
  std::vector<std::vector<int32_t>> tables(ns);
  std::vector<Tensor> k_all(ns), v_all(ns), k_rounded(ns), v_rounded(ns);
  int t_dim = 0;
  for (int s = 0; s < ns; ++s) {
    const int len = seqs[s].cached + seqs[s].chunk;
    for (int b = 0; b < (len + block_size - 1) / block_size; ++b) {
      tables[s].push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    k_all[s] = random_f32({len, row}, rng, -2.0f, 2.0f);
    v_all[s] = random_f32({len, row}, rng, -2.0f, 2.0f);
    k_rounded[s] = rounded_copy(k_all[s]);
    v_rounded[s] = rounded_copy(v_all[s]);
    t_dim += seqs[s].chunk;
  }
  Tensor q = random_f32({t_dim, hq * hd}, rng, -2.0f, 2.0f);

  const Tensor got = run_attention(*be, DType::BF16, hq, hkv, hd, block_size, seqs, tables, k_all,
                                   v_all, q, num_blocks);
  const Tensor want = run_attention(*be, DType::F32, hq, hkv, hd, block_size, seqs, tables,
                                    k_rounded, v_rounded, q, num_blocks);
  const Tensor unrounded = run_attention(*be, DType::F32, hq, hkv, hd, block_size, seqs, tables,
                                         k_all, v_all, q, num_blocks);
  // Relative to the magnitude of what was summed (sum_p w_p |v_p|): the two paths may differ
  // in the last bit of a score where a row's tail (hd not a multiple of the vector width) is
  // contracted differently, which moves an output near zero by ~1e-7 of the V scale.
  const std::vector<double> mag = magnitudes(seqs, k_rounded, v_rounded, q, hq, hkv, hd);
  EXPECT_TRUE(all_close(got, values(want), 1e-6, 0.0, &mag))
      << "hq=" << hq << " hkv=" << hkv << " hd=" << hd << " block=" << block_size;
  // The tolerance tells the rounding apart: the unrounded f32 cache's output is outside it.
  EXPECT_FALSE(all_close(unrounded, values(want), 1e-6, 0.0, &mag))
      << "hq=" << hq << " hkv=" << hkv << " hd=" << hd << " block=" << block_size;
}

TEST(CpuKvCacheBf16, AttentionEqualsF32CacheOfRoundedKv) {
  // A fresh prefill, a decode after a long prefix, a prefill chunk after a cached prefix,
  // and a one-token sequence, in one batch; then a decode-only batch.
  const std::vector<std::vector<SeqSpec>> batches = {{{0, 9}, {21, 1}, {5, 7}, {0, 1}},
                                                     {{30, 1}, {3, 1}, {17, 1}}};
  uint32_t seed = 500;
  for (const auto& seqs : batches)
    for (auto [hq, hkv] : {std::pair<int, int>{4, 4}, {4, 2}, {8, 2}})
      for (int hd : {16, 24, 64, 128})
        for (int block_size : {1, 4, 16}) check_bf16_cache(hq, hkv, hd, block_size, seqs, seed++);
}

TEST(CpuKvCacheBf16, StoreRoundsToNearestEven) {
  auto be = make_cpu_backend(1);
  // Halfway cases: 1 + 2^-8 sits between bf16 1 and 1 + 2^-7 (ties to the even 1);
  // 1 + 3 * 2^-8 between 1 + 2^-7 and 1 + 2^-6 (ties to the even 1 + 2^-6); just above a
  // tie rounds up; a truncating conversion would get the second and third wrong.
  const std::vector<float> x = {1.0f + 0x1p-8f,
                                1.0f + 3 * 0x1p-8f,
                                1.0f + 0x1p-8f + 0x1p-20f,
                                -(1.0f + 3 * 0x1p-8f),
                                0.0f,
                                -0.0f,
                                65504.0f,
                                1e-30f};
  const std::vector<float> want = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -(1.0f + 0x1p-6f),
                                   0.0f, -0.0f,          65536.0f,       round_bf16(1e-30f)};
  const int hd = static_cast<int>(x.size());
  KvCacheLayer cache{be->alloc({1, 1, 1, hd}, DType::BF16), be->alloc({1, 1, 1, hd}, DType::BF16)};
  Tensor k = be->alloc({1, hd}, DType::F32), v = be->alloc({1, hd}, DType::F32);
  std::copy(x.begin(), x.end(), k.ptr<float>());
  std::copy(x.begin(), x.end(), v.ptr<float>());
  const BatchMeta b = single_token_step(0, 0, {0});
  be->store_kv(k, v, b, cache);
  for (int i = 0; i < hd; ++i) {
    const float got_k = bf16_to_f32(cache.k.ptr<uint16_t>()[i]);
    const float got_v = bf16_to_f32(cache.v.ptr<uint16_t>()[i]);
    EXPECT_EQ(std::memcmp(&got_k, &want[i], 4), 0) << i << ": " << got_k << " vs " << want[i];
    EXPECT_EQ(std::memcmp(&got_v, &want[i], 4), 0) << i << ": " << got_v << " vs " << want[i];
  }
}

TEST(CpuKvCacheBf16, RejectsMixedDtypes) {
  auto be = make_cpu_backend(1);
  KvCacheLayer cache{be->alloc({2, 4, 1, 8}, DType::BF16), be->alloc({2, 4, 1, 8}, DType::F32)};
  Tensor k = be->alloc({1, 8}, DType::F32), v = be->alloc({1, 8}, DType::F32);
  const BatchMeta b = single_token_step(0, 0, {0});
  EXPECT_ANY_THROW(be->store_kv(k, v, b, cache));
}

TEST(KvCacheSizing, Bf16HalvesTheBytesPerBlock) {
  ModelConfig c;
  c.num_layers = 3;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  const size_t f32 = KvCache::bytes_per_block(c, 16, DType::F32);
  EXPECT_EQ(f32, 2ull * 3 * 16 * 2 * 64 * 4);
  EXPECT_EQ(KvCache::bytes_per_block(c, 16), f32);  // the default stays f32
  EXPECT_EQ(KvCache::bytes_per_block(c, 16, DType::BF16) * 2, f32);
  const size_t budget = 10 * f32 + 7;
  EXPECT_EQ(KvCache::blocks_for_budget(c, 16, budget, DType::F32), 10);
  EXPECT_EQ(KvCache::blocks_for_budget(c, 16, budget, DType::BF16), 20);

  auto be = make_cpu_backend(1);
  EXPECT_TRUE(be->capabilities().kv_cache_dtypes.contains(DType::BF16));
  EXPECT_FALSE(be->capabilities().kv_cache_dtypes.contains(DType::F16));
  const KvCache cache = KvCache::allocate(*be, c, 5, 16, DType::BF16);
  EXPECT_EQ(cache.dtype, DType::BF16);
  ASSERT_EQ(cache.layers.size(), 3u);
  EXPECT_EQ(cache.layers[0].k.dtype, DType::BF16);
  EXPECT_EQ(cache.layers[0].v.nbytes() * 2 * 3, 5 * KvCache::bytes_per_block(c, 16, DType::BF16));
  EXPECT_ANY_THROW(KvCache::allocate(*be, c, 5, 16, DType::F16));
}

}  // namespace
}  // namespace attnres::test
