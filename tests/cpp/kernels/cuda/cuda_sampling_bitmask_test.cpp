// CudaBackend::sample with structured-output bitmasks (SampleRow::bitmask_row) against
// CpuBackend::sample (the oracle: the host path's masking bit for bit,
// tests/cpp/kernels/cpu/cpu_sampling_bitmask_test.cpp): masks of every density next to rows
// without one, at the real vocabulary (151936, 151669 decodable) and at small and odd ones,
// with every split of a row over 1, 2, 4 and 8 CTAs (each must give the planned split's ids).
// Tolerance (cuda_sampling_reference.h): greedy rows exactly; a random row must match unless
// its draw lies near a boundary of its masked distribution (skipped, counted, and rare).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda_sampling_reference.h"
#include "cuda_test_util.h"
#include "engine/sample/sampler.h"
#include "engine/sample/token_bitmask.h"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::test {
namespace {

using sampling::near_a_boundary;
using sampling::RowCase;

RowCase random_case(std::mt19937_64& rng, int vocab, int decodable, int r) {
  auto pick = [&](auto... values) {
    const std::vector<std::common_type_t<decltype(values)...>> v{values...};
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  RowCase c;
  SamplingParams& p = c.params;
  p.seed = rng();
  p.temperature = pick(0.0f, 0.7f, 1.0f, 1.6f);
  p.top_k = pick(0, 1, 20, 4000);
  p.top_p = pick(1.0f, 0.8f, 0.95f);
  p.min_p = pick(0.0f, 0.05f);
  p.repetition_penalty = pick(1.0f, 1.2f);
  p.presence_penalty = pick(0.0f, 0.5f);
  p.frequency_penalty = pick(0.0f, -0.6f);
  p.min_tokens = pick(0, 50);
  std::uniform_int_distribution<int32_t> id(0, decodable - 1);
  for (int i = pick(1, 30); i > 0; --i) c.prompt.push_back(id(rng));
  for (int i = pick(0, 5); i > 0; --i) c.output.push_back(id(rng));
  // Every fifth row has no mask; the others allow a share of the ids from one to all.
  if (r % 5 != 0) {
    const double density = std::vector<double>{0.0, 0.002, 0.4, 1.0}[r % 5 - 1];
    c.mask.assign(static_cast<size_t>(token_bitmask_words(vocab)), 0);
    std::bernoulli_distribution allow(density);
    auto set = [&](int64_t i) {
      c.mask[static_cast<size_t>(i / 32)] |= static_cast<int32_t>(1u << (i % 32));
    };
    for (int64_t i = 0; i < static_cast<int64_t>(c.mask.size()) * 32; ++i) {
      if (i >= vocab ? (rng() & 1) : allow(rng)) set(i);  // stray bits past the vocabulary too
    }
    set(id(rng));  // at least one decodable id
  }
  return c;
}

void check_masked_batch(int rows, uint64_t seed, int vocab, int decodable) {
  std::mt19937_64 rng(seed);
  const std::vector<int32_t> eos_ids = {decodable - 1};
  CpuBackend cpu(8);
  CudaBackend gpu;
  std::vector<RowCase> cases;
  std::vector<std::vector<float>> raw;
  Tensor host = Tensor::empty({rows, vocab}, DType::F32);
  SampleBatch batch;
  batch.decodable = decodable;
  for (int r = 0; r < rows; ++r) {
    cases.push_back(random_case(rng, vocab, decodable, r));
    raw.push_back(sampling::model_like_logits(rng, vocab));
    std::copy(raw[r].begin(), raw[r].end(), host.ptr<float>() + static_cast<int64_t>(r) * vocab);
    Sampler(cases[r].params, 7).add_device_row(cases[r].prompt, cases[r].output, eos_ids, batch);
    if (!cases[r].mask.empty()) {
      batch.rows.back().bitmask_row =
          static_cast<int32_t>(batch.bitmask.size() / cases[r].mask.size());
      batch.bitmask.insert(batch.bitmask.end(), cases[r].mask.begin(), cases[r].mask.end());
    }
  }
  std::vector<int32_t> got(rows), expected(rows);
  Tensor device_logits = to_device(gpu, host);
  gpu.sample(device_logits, batch, got);
  for (int ctas : {1, 2, 4, 8}) {
    if (cuda::sample_slice_ids(vocab, ctas) > cuda::kMaxSampleSliceIds) continue;
    Tensor split_logits = to_device(gpu, host);
    std::vector<int32_t> split(rows);
    gpu.sample(split_logits, batch, split, ctas);
    EXPECT_EQ(split, got) << ctas << " CTAs per row (vocab " << vocab << ", " << rows << " rows)";
  }
  cpu.sample(host, batch, expected);
  int random_rows = 0, skipped = 0;
  for (int r = 0; r < rows; ++r) {
    const SampleRow& row = batch.rows[r];
    if (!row.greedy) {
      ++random_rows;
      if (got[r] != expected[r] &&
          near_a_boundary(raw[r], cases[r], row.uniform, eos_ids, decodable)) {
        ++skipped;
        continue;
      }
    }
    EXPECT_EQ(got[r], expected[r])
        << "row " << r << " of " << rows << " (vocab " << vocab << "), mask words "
        << cases[r].mask.size() << ", greedy " << row.greedy << ", uniform " << row.uniform;
  }
  EXPECT_LE(skipped * 20, std::max(random_rows, 20))
      << skipped << " of " << random_rows << " random rows near a boundary";
}

TEST(CudaSampleBitmask, MatchesTheCpuOpAtTheRealVocabulary) {
  SKIP_WITHOUT_CUDA();
  for (uint64_t seed = 0; seed < 4; ++seed)
    check_masked_batch(1 + 5 * static_cast<int>(seed), seed, 151936, 151669);
  check_masked_batch(64, 10, 151936, 151669);
}

TEST(CudaSampleBitmask, MatchesTheCpuOpAtSmallAndOddVocabularies) {
  SKIP_WITHOUT_CUDA();
  check_masked_batch(20, 20, 40, 37);
  check_masked_batch(20, 21, 4099, 4000);
  check_masked_batch(10, 22, 300007, 300000);
}

// A mask allowing one id with the row's lowest logit: greedy and random rows both pick it,
// mask rows read in any order, and the staging (ids, then the bitmask) is reused without
// allocating once grown.
TEST(CudaSampleBitmask, AMaskAllowingOneIdPicksItAndTheStagingIsReused) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu;
  const int vocab = 151936;
  Tensor host = Tensor::empty({2, vocab}, DType::F32);
  for (int64_t i = 0; i < 2 * int64_t{vocab}; ++i)
    host.ptr<float>()[i] = static_cast<float>(i % 97);
  const int32_t allowed = 97 * 1000;  // logit 0: the lowest
  SampleBatch batch;
  batch.decodable = vocab;
  batch.rows.resize(2);
  batch.rows[0].greedy = true;
  batch.rows[1].uniform = 0.999;
  batch.rows[0].bitmask_row = 1;
  batch.rows[1].bitmask_row = 0;
  const size_t words = static_cast<size_t>(token_bitmask_words(vocab));
  batch.bitmask.assign(2 * words, 0);
  for (size_t m = 0; m < 2; ++m) batch.bitmask[m * words + allowed / 32] = 1 << (allowed % 32);
  for (int call = 0; call < 3; ++call) {
    Tensor dev = to_device(gpu, host);
    const cuda::CachingAllocator::Stats before = gpu.allocator_stats();
    std::vector<int32_t> got(2);
    gpu.sample(dev, batch, got);
    EXPECT_EQ(got, (std::vector<int32_t>{allowed, allowed})) << "call " << call;
    if (call > 0) {
      EXPECT_EQ(gpu.allocator_stats().raw_allocations, before.raw_allocations) << call;
    }
  }
}

TEST(CudaSampleBitmask, RefusesAMaskRowOutsideTheBitmask) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu;
  Tensor dev = to_device(gpu, filled_host({1, 40}, 1.0f));
  SampleBatch batch;
  batch.decodable = 40;
  batch.rows.emplace_back();
  batch.rows[0].bitmask_row = 1;
  batch.bitmask = {-1, -1};
  std::vector<int32_t> got(1);
  EXPECT_THROW(gpu.sample(dev, batch, got), std::logic_error);
  batch.bitmask = {-1, -1, -1};  // not whole rows of 2 words
  batch.rows[0].bitmask_row = 0;
  EXPECT_THROW(gpu.sample(dev, batch, got), std::logic_error);
}

// Host logic (no GPU): the bitmask's place in the staging.
TEST(CudaSampleBitmaskPlan, StagingPutsTheBitmaskBetweenTheIdsAndTheOutput) {
  for (int64_t rows : {1, 5, 256}) {
    for (int64_t ids : {0, 3, 1000}) {
      for (int64_t words : {0, 2, 4748 * 64}) {
        const cuda::SampleStagingLayout l = cuda::sample_staging_layout(rows, ids, words);
        EXPECT_EQ(l.bitmask_offset, l.ids_offset + static_cast<size_t>(ids) * sizeof(int32_t));
        EXPECT_EQ(l.upload_bytes, l.bitmask_offset + static_cast<size_t>(words) * sizeof(int32_t));
        EXPECT_GE(l.out_offset, l.upload_bytes);
        EXPECT_EQ(l.out_offset % 256, 0u);
      }
    }
  }
}

}  // namespace
}  // namespace attnres::test
