// Attention rounds a query the same way whatever shares its call: bit for bit, every token of
// a batch (prefill chunks over cached prefixes, decodes, several sequences) equals that token
// attended alone as a one-token step (a decode), for f32 and bf16 caches, with f32 inputs and
// (AVX512_BF16 builds, bf16 cache) bf16 inputs (cpu_attention_bf16.h), GQA groups of 1 to 8
// query heads per KV head (work items of up to 8 tokens x 8 heads, in row blocks of 4), head
// sizes with a partial last vector, and any thread count. This is batch invariance for attention:
// the kernel shares K / V loads among the rows of a work item (cpu_attention.cpp) but never their
// arithmetic.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.h"
#include "tests/cpp/kernels/cpu/paged_kv_steps.h"
#include "tests/cpp/kernels/cpu/test_util.h"

namespace attnres::test {
namespace {

void expect_tokens_alone_equal_batch(DType dtype, bool bf16_inputs, int hq, int hkv, int hd,
                                     int threads, uint32_t seed) {
  auto be = std::make_unique<CpuBackend>(threads);
  be->set_bf16_linear_inputs(bf16_inputs);
  std::mt19937 rng(seed);
  constexpr int kBlockSize = 4, kBlocks = 64;
  const int row = hkv * hd;
  KvCacheLayer cache{be->alloc({kBlocks, kBlockSize, hkv, hd}, dtype),
                     be->alloc({kBlocks, kBlockSize, hkv, hd}, dtype)};
  // A prefill, a decode after a prefix, a chunk after a prefix, a lone token, a chunk whose
  // contexts span several 16-key blocks (chunks of 9 and 12 leave tiles of 1 and 4 tokens).
  const std::vector<SeqSpec> seqs = {{0, 9}, {21, 1}, {5, 7}, {0, 1}, {30, 12}};
  const auto tables = shuffled_block_tables(seqs, kBlockSize, kBlocks, rng);
  std::vector<Tensor> k_all, v_all;
  for (const SeqSpec& spec : seqs) {
    const int len = spec.cached + spec.chunk;
    k_all.push_back(random_tensor({len, row}, DType::F32, rng));
    v_all.push_back(random_tensor({len, row}, DType::F32, rng));
  }
  store_paged_step(*be, seqs, tables, kBlockSize, row, k_all, v_all, cache, true);
  const BatchMeta batch =
      store_paged_step(*be, seqs, tables, kBlockSize, row, k_all, v_all, cache, false);
  const int t_dim = batch.num_tokens;
  const Tensor q = random_tensor({t_dim, hq * hd}, DType::F32, rng, -2.0f, 2.0f);
  Tensor all = be->alloc({t_dim, hq * hd}, DType::F32);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  be->attention(q, cache, batch, hd, scale, all);
  for (int s = 0; s < batch.num_seqs(); ++s) {
    for (int t = batch.query_start[s]; t < batch.query_start[s + 1]; ++t) {
      const BatchMeta alone =
          single_token_step(batch.positions[t], batch.slot_mapping[t], batch.block_tables[s]);
      Tensor one = be->alloc({1, hq * hd}, DType::F32);
      be->attention(q.rows(t, t + 1), cache, alone, hd, scale, one);
      ASSERT_EQ(0, std::memcmp(one.data, all.rows(t, t + 1).data, one.nbytes()))
          << name(dtype) << (bf16_inputs ? " bf16 inputs" : "") << " hq=" << hq << " hkv=" << hkv
          << " hd=" << hd << " threads=" << threads << ": token " << t << " of sequence " << s;
    }
  }
}

TEST(CpuAttention, EveryTokenEqualsItselfAloneBitForBit) {
  uint32_t seed = 7;
  for (DType dtype : {DType::F32, DType::BF16})
    for (auto [hq, hkv] : {std::pair<int, int>{4, 4}, {4, 2}, {6, 2}, {16, 2}})
      for (int hd : {24, 48, 64, 128})
        for (int threads : {1, 3})
          expect_tokens_alone_equal_batch(dtype, false, hq, hkv, hd, threads, seed++);
}

TEST(CpuAttention, WithBf16InputsEveryTokenEqualsItselfAloneBitForBit) {
  if (!CpuBackend::bf16_linear_inputs_supported()) GTEST_SKIP() << "no AVX512_BF16 in this build";
  uint32_t seed = 300;
  for (auto [hq, hkv] : {std::pair<int, int>{4, 4}, {6, 2}, {16, 2}})
    for (int hd : {24, 64, 100, 128})
      for (int threads : {1, 3})
        expect_tokens_alone_equal_batch(DType::BF16, true, hq, hkv, hd, threads, seed++);
}

}  // namespace
}  // namespace attnres::test
