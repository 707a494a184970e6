// CudaBackend::sample against CpuBackend::sample (the oracle: the host Sampler bit for bit,
// tests/cpp/kernels/cpu/cpu_sampling_test.cpp) at the real vocabulary of 151936 (151669
// decodable), batches of 1, 4, 64 and 256 rows with every parameter non-zero somewhere, and
// at small and odd vocabularies. Every batch also runs with 1, 2, 4 and 8 CTAs per row: the
// split's merges are exact, so every split must give the one-CTA ids bit for bit.
// Tolerance (cuda_sampling_reference.h): the processing before the draw is the same f32
// arithmetic, so greedy rows must match exactly; a random row must match unless its draw lies
// near a boundary of its distribution (near_a_boundary); such rows are skipped and counted,
// and must be rare.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "cuda_sampling_reference.h"
#include "cuda_test_util.h"
#include "engine/sample/sampler.h"
#include "kernels/cuda/cuda_kernels.h"

namespace attnres::test {
namespace {

using sampling::near_a_boundary;
using sampling::RowCase;

constexpr int kVocab = 151936;
constexpr int kDecodable = 151669;
constexpr int kH100Sms = 132;

struct VocabShape {
  int vocab = kVocab;
  int decodable = kDecodable;
};

RowCase random_case(std::mt19937_64& rng, VocabShape shape) {
  auto pick = [&](auto... values) {
    const std::vector<std::common_type_t<decltype(values)...>> v{values...};
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  RowCase c;
  SamplingParams& p = c.params;
  p.seed = rng();
  p.temperature = pick(0.0f, 0.7f, 1.0f, 1.6f);
  p.top_k = pick(0, 1, 20, 50, 4000, shape.vocab + 5);
  p.top_p = pick(1.0f, 1e-6f, 0.8f, 0.95f);
  p.min_p = pick(0.0f, 0.01f, 0.1f);
  p.repetition_penalty = pick(1.0f, 1.2f, 0.9f);
  p.presence_penalty = pick(0.0f, 0.5f, -1.0f);
  p.frequency_penalty = pick(0.0f, 0.3f, -0.6f);
  p.min_tokens = pick(0, 50);
  p.stop_token_ids = {static_cast<int32_t>(rng() % shape.decodable)};
  std::uniform_int_distribution<int32_t> id(
      0, std::min(pick(50, 2000, shape.decodable - 1), shape.decodable - 1));
  for (int i = pick(1, 30, 500); i > 0; --i) c.prompt.push_back(id(rng));
  for (int i = pick(0, 5, 200); i > 0; --i) c.output.push_back(id(rng));
  return c;
}

// Row r's parameters set to reach one path of sample_kernel each, in turn: greedy; the
// token-id-order draw (no top-k / top-p); top-k; top-p; top-k, top-p and min-p; every penalty
// with min_tokens blocking the EOS and stop ids; greedy after penalties.
void force_path(RowCase& c, int r) {
  SamplingParams& p = c.params;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.repetition_penalty = 1.0f;
  p.presence_penalty = p.frequency_penalty = 0.0f;
  p.min_tokens = 0;
  switch (r % 7) {
    case 0:
      p.temperature = 0.0f;
      break;
    case 1:
      break;
    case 2:
      p.top_k = 20;
      break;
    case 3:
      p.top_p = 0.8f;
      break;
    case 4:
      p.top_k = 50, p.top_p = 0.95f, p.min_p = 0.1f;
      break;
    case 5:
      p.temperature = 0.7f, p.min_tokens = 50;
      p.repetition_penalty = 1.2f, p.presence_penalty = 0.5f, p.frequency_penalty = 0.3f;
      break;
    default:
      p.temperature = 0.0f;
      p.repetition_penalty = 0.9f, p.presence_penalty = -1.0f, p.frequency_penalty = -0.6f;
      break;
  }
}

// every_path: the rows' parameters from force_path instead of random_case's draw.
void check_batch(int rows, uint64_t seed, VocabShape shape = {}, bool every_path = false) {
  std::mt19937_64 rng(seed);
  // EOS ids inside every vocabulary tested (min_tokens blocks them).
  const std::vector<int32_t> eos_ids = {shape.decodable - 1, shape.decodable / 2};
  CpuBackend cpu(8);
  CudaBackend gpu;
  std::vector<RowCase> cases;
  Tensor host = Tensor::empty({rows, shape.vocab}, DType::F32);
  SampleBatch batch;
  batch.decodable = shape.decodable;
  std::vector<std::vector<float>> raw;
  for (int r = 0; r < rows; ++r) {
    cases.push_back(random_case(rng, shape));
    if (every_path) force_path(cases.back(), r);
    raw.push_back(sampling::model_like_logits(rng, shape.vocab));
    std::copy(raw[r].begin(), raw[r].end(),
              host.ptr<float>() + static_cast<int64_t>(r) * shape.vocab);
    Sampler(cases[r].params, 7).add_device_row(cases[r].prompt, cases[r].output, eos_ids, batch);
  }
  // The planned split, twice (determinism, and the persistent staging and counts reused),
  // then every split against the one-CTA ids.
  std::vector<int32_t> expected(rows), got(rows), again(rows);
  Tensor device_logits = to_device(gpu, host);
  gpu.sample(device_logits, batch, got);
  Tensor device_again = to_device(gpu, host);
  gpu.sample(device_again, batch, again);
  EXPECT_EQ(got, again) << "the CUDA op is not deterministic";
  for (int ctas : {1, 2, 4, 8}) {
    if (cuda::sample_slice_ids(shape.vocab, ctas) > cuda::kMaxSampleSliceIds) continue;
    Tensor split_logits = to_device(gpu, host);
    std::vector<int32_t> split(rows);
    gpu.sample(split_logits, batch, split, ctas);
    EXPECT_EQ(split, got) << ctas << " CTAs per row differ from the planned "
                          << cuda::plan_sample_ctas_per_row(rows, shape.vocab, kH100Sms)
                          << " (vocab " << shape.vocab << ", " << rows << " rows)";
  }
  cpu.sample(host, batch, expected);
  int random_rows = 0, skipped = 0;
  for (int r = 0; r < rows; ++r) {
    const SampleRow& row = batch.rows[r];
    if (!row.greedy) {
      ++random_rows;
      if (got[r] != expected[r] &&
          near_a_boundary(raw[r], cases[r], row.uniform, eos_ids, shape.decodable)) {
        ++skipped;
        continue;
      }
    }
    const SamplingParams& p = cases[r].params;
    EXPECT_EQ(got[r], expected[r])
        << "row " << r << " of " << rows << ": temperature " << p.temperature << " top_k "
        << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p << " penalties "
        << p.repetition_penalty << "/" << p.presence_penalty << "/" << p.frequency_penalty
        << " uniform " << row.uniform;
  }
  EXPECT_LE(skipped * 20, std::max(random_rows, 20))
      << skipped << " of " << random_rows << " random rows near a boundary";
}

TEST(CudaSample, MatchesTheCpuOpAtBatch1) {
  SKIP_WITHOUT_CUDA();
  for (uint64_t seed = 0; seed < 16; ++seed) check_batch(1, seed);
}

TEST(CudaSample, MatchesTheCpuOpAtBatch4) {
  SKIP_WITHOUT_CUDA();
  for (uint64_t seed = 50; seed < 54; ++seed) check_batch(4, seed);
}

TEST(CudaSample, MatchesTheCpuOpAtBatch64) {
  SKIP_WITHOUT_CUDA();
  check_batch(64, 100);
}

TEST(CudaSample, MatchesTheCpuOpAtBatch256) {
  SKIP_WITHOUT_CUDA();
  check_batch(256, 200);
}

// Slices of a few ids, empty CTAs (vocab 40 over 8 CTAs: ranks 2..7 own nothing), a vocab
// that is no multiple of 32, and one whose one-CTA slice would not fit (two CTAs at least).
TEST(CudaSample, MatchesTheCpuOpAtSmallOddAndLargeVocabularies) {
  SKIP_WITHOUT_CUDA();
  check_batch(16, 300, {40, 37});
  check_batch(16, 301, {4099, 4000});
  check_batch(8, 302, {128256, 128256});
  check_batch(4, 303, {300007, 300000});
}

// Sanitizer-sized (docs/RELIABILITY.md "GPU sanitizers"): sample_kernel<1, 2, 4, 8>, whose
// CTAs of a row merge through distributed shared memory, on every path of force_path (7 rows
// and one more greedy), at vocab 4099 (slices of 4128, 2080, 1056 and 544 ids: every rank
// owns ids, the last a partial line) and at vocab 40 (8 CTAs: ranks 2..7 own nothing).
// check_batch runs each batch at the planned split twice and at 1, 2, 4 and 8 CTAs per row.
TEST(CudaSanitizerSized, SampleClusterMerges) {
  SKIP_WITHOUT_CUDA();
  check_batch(8, 310, {4099, 4000}, true);
  check_batch(8, 311, {40, 37}, true);
}

// The staging grows to a batch and is then reused on one backend: later batches, smaller or
// equal, make no raw allocation and leave nothing allocated, and the penalty counts are still
// zero after calls with and without penalties (greedy rows: the CPU op is an exact oracle).
TEST(CudaSample, StagingIsReusedWithoutAllocating) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu;
  CpuBackend cpu(8);
  std::mt19937_64 rng(401);
  auto run = [&](int rows, bool penalties) {
    SampleBatch batch;
    batch.decodable = kDecodable;
    Tensor host = Tensor::empty({rows, kVocab}, DType::F32);
    for (int r = 0; r < rows; ++r) {
      RowCase c = random_case(rng, {});
      c.params.temperature = 0.0f;  // greedy: the CPU is an exact oracle
      c.params.presence_penalty = penalties ? 0.5f : 0.0f;
      c.params.frequency_penalty = penalties ? 0.3f : 0.0f;
      const std::vector<float> row = sampling::model_like_logits(rng, kVocab);
      std::copy(row.begin(), row.end(), host.ptr<float>() + static_cast<int64_t>(r) * kVocab);
      const std::vector<int32_t> eos_ids = {151645};
      Sampler(c.params, 7).add_device_row(c.prompt, c.output, eos_ids, batch);
    }
    Tensor dev = to_device(gpu, host);
    const cuda::CachingAllocator::Stats before = gpu.allocator_stats();
    std::vector<int32_t> got(rows), expected(rows);
    gpu.sample(dev, batch, got);
    const cuda::CachingAllocator::Stats after = gpu.allocator_stats();
    cpu.sample(host, batch, expected);
    EXPECT_EQ(got, expected) << rows << " rows, penalties " << penalties;
    return std::pair{before, after};
  };
  run(64, true);  // grows the staging and the counts
  for (auto [rows, penalties] : {std::pair{4, false}, std::pair{64, true}, std::pair{1, true}}) {
    const auto [before, after] = run(rows, penalties);
    EXPECT_EQ(after.raw_allocations, before.raw_allocations) << rows << " rows";
    EXPECT_EQ(after.in_use, before.in_use) << rows << " rows: sample allocated";
  }
}

// sample_async (async scheduling): the same ids as sample(), greedy rows against the CPU op
// exactly, once wait_sampled() returns; a second sample_async before the wait finishes the
// first one itself (the staging is rewritten), and a wait with nothing in flight is a no-op.
TEST(CudaSample, AsyncGivesTheSynchronousIdsAfterTheWait) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu;
  CpuBackend cpu(8);
  EXPECT_TRUE(gpu.capabilities().samples_asynchronously);
  std::mt19937_64 rng(402);
  const std::vector<int32_t> eos_ids = {151645};
  auto make = [&](int rows, bool greedy, Tensor& host) {
    SampleBatch batch;
    batch.decodable = kDecodable;
    host = Tensor::empty({rows, kVocab}, DType::F32);
    for (int r = 0; r < rows; ++r) {
      RowCase c = random_case(rng, {});
      if (greedy) c.params.temperature = 0.0f;
      const std::vector<float> row = sampling::model_like_logits(rng, kVocab);
      std::copy(row.begin(), row.end(), host.ptr<float>() + static_cast<int64_t>(r) * kVocab);
      Sampler(c.params, 7).add_device_row(c.prompt, c.output, eos_ids, batch);
    }
    return batch;
  };
  Tensor host_a, host_b;
  const SampleBatch a = make(64, true, host_a);
  const SampleBatch b = make(33, false, host_b);
  std::vector<int32_t> sync_a(64), sync_b(33), cpu_a(64);
  Tensor dev = to_device(gpu, host_a);
  gpu.sample(dev, a, sync_a);
  dev = to_device(gpu, host_b);
  gpu.sample(dev, b, sync_b);
  // The sampled rows are scratch (Backend::sample): the CPU samples a copy, so that host_a
  // still holds the logits the async calls upload below.
  Tensor cpu_logits = Tensor::empty(host_a.shape, DType::F32);
  std::copy_n(host_a.ptr<float>(), host_a.numel(), cpu_logits.ptr<float>());
  cpu.sample(cpu_logits, a, cpu_a);
  EXPECT_EQ(sync_a, cpu_a);

  std::vector<int32_t> async_a(64, -7), async_b(33, -7);
  Tensor dev_a = to_device(gpu, host_a), dev_b = to_device(gpu, host_b);
  gpu.sample_async(dev_a, a, async_a);
  gpu.sample_async(dev_b, b, async_b);  // waits for a's ids first
  EXPECT_EQ(async_a, sync_a);
  gpu.wait_sampled();
  EXPECT_EQ(async_b, sync_b);
  gpu.wait_sampled();  // nothing in flight
  EXPECT_EQ(async_b, sync_b);
}

TEST(CudaSample, RowsTheHostWouldRefuseGetTheirCodes) {
  SKIP_WITHOUT_CUDA();
  CudaBackend gpu;
  const int vocab = 40;
  Tensor host = Tensor::empty({3, vocab}, DType::F32);
  float* x = host.ptr<float>();
  for (int i = 0; i < 3 * vocab; ++i) x[i] = static_cast<float>(i % 7);
  x[5] = NAN;
  x[vocab + 39] = INFINITY;  // a padding id: still refused
  for (int i = 0; i < 30; ++i) x[2 * vocab + i] = -INFINITY;
  SampleBatch batch;
  batch.decodable = 30;
  for (int r = 0; r < 3; ++r) batch.rows.emplace_back();
  for (int ctas : {0, 1, 2, 4, 8}) {
    Tensor dev = to_device(gpu, host);
    std::vector<int32_t> got(3);
    gpu.sample(dev, batch, got, ctas);
    EXPECT_EQ(got, (std::vector<int32_t>{kSampleNonFiniteLogit, kSampleNonFiniteLogit,
                                         kSampleNoDecodableLogit}))
        << ctas << " CTAs per row";
  }
}

// Host logic: the split plan and the staging layout (no GPU needed).
TEST(CudaSamplePlan, SplitsRowsOverSmsWhenFew) {
  for (auto [rows, ctas] :
       {std::pair{1, 8}, std::pair{4, 8}, std::pair{16, 8}, std::pair{17, 4}, std::pair{33, 4},
        std::pair{34, 2}, std::pair{66, 2}, std::pair{67, 1}, std::pair{256, 1}}) {
    EXPECT_EQ(cuda::plan_sample_ctas_per_row(rows, kVocab, kH100Sms), ctas) << rows << " rows";
  }
  // Small vocabularies stay whole: a slice keeps kMinSampleSliceIds ids.
  EXPECT_EQ(cuda::plan_sample_ctas_per_row(1, 40, kH100Sms), 1);
  EXPECT_EQ(cuda::plan_sample_ctas_per_row(1, 16384, kH100Sms), 2);
  EXPECT_EQ(cuda::plan_sample_ctas_per_row(1, 32000, kH100Sms), 2);
  EXPECT_EQ(cuda::plan_sample_ctas_per_row(1, 32768, kH100Sms), 4);
  // Large ones split until a slice's bitmap fits, however many rows.
  EXPECT_EQ(cuda::plan_sample_ctas_per_row(256, 300007, kH100Sms), 2);
  EXPECT_EQ(cuda::plan_sample_ctas_per_row(256, (1 << 20) - 1, kH100Sms), 4);
  for (int64_t vocab : {1, 40, 4099, 128256, 151936, 300007, (1 << 20) - 1}) {
    for (int64_t rows : {1, 3, 16, 40, 100, 256}) {
      const int ctas = cuda::plan_sample_ctas_per_row(rows, vocab, kH100Sms);
      EXPECT_TRUE(ctas == 1 || ctas == 2 || ctas == 4 || ctas == 8) << ctas;
      const int64_t slice = cuda::sample_slice_ids(vocab, ctas);
      EXPECT_LE(slice, cuda::kMaxSampleSliceIds) << vocab;
      EXPECT_GE(slice * ctas, vocab);
      EXPECT_EQ(slice % 32, 0);
      if (ctas > 1 && rows * ctas > kH100Sms) {
        EXPECT_GT(cuda::sample_slice_ids(vocab, ctas / 2), cuda::kMaxSampleSliceIds)
            << "more CTAs than SMs only when the bitmap needs them";
      }
    }
  }
}

TEST(CudaSamplePlan, StagingLayoutAndGrowth) {
  for (int64_t rows : {1, 3, 64, 256}) {
    for (int64_t ids : {0, 1, 7, 100000}) {
      const cuda::SampleStagingLayout l = cuda::sample_staging_layout(rows, ids);
      EXPECT_GE(l.ids_offset, static_cast<size_t>(rows) * sizeof(SampleRow));
      EXPECT_EQ(l.ids_offset % 256, 0u);
      EXPECT_EQ(l.upload_bytes, l.ids_offset + static_cast<size_t>(ids) * sizeof(int32_t));
      EXPECT_GE(l.out_offset, l.upload_bytes);
      EXPECT_EQ(l.out_offset % 256, 0u);
      EXPECT_EQ(l.total_bytes, l.out_offset + static_cast<size_t>(rows) * sizeof(int32_t));
    }
  }
  EXPECT_EQ(cuda::grown_staging_bytes(1000, 1000), 1000u);
  EXPECT_EQ(cuda::grown_staging_bytes(1000, 10), 1000u);
  EXPECT_EQ(cuda::grown_staging_bytes(1000, 1001), 2000u);
  EXPECT_EQ(cuda::grown_staging_bytes(1000, 5000), 5000u);
  EXPECT_EQ(cuda::grown_staging_bytes(0, 64), 64u);
  // A batch growing one row at a time regrows a logarithmic number of times.
  size_t capacity = 0;
  int regrowths = 0;
  for (int64_t rows = 1; rows <= 256; ++rows) {
    const size_t needed = cuda::sample_staging_layout(rows, rows * 600).total_bytes;
    const size_t next = cuda::grown_staging_bytes(capacity, needed);
    EXPECT_GE(next, needed);
    regrowths += next != capacity;
    capacity = next;
  }
  EXPECT_LE(regrowths, 9);
}

}  // namespace
}  // namespace attnres::test
