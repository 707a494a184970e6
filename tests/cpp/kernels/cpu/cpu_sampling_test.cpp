// CpuBackend::sample against the host Sampler (engine/sample/sampler.h), bit for bit: for each
// row, two Samplers with the same parameters and seed; one samples on the host (the engine's
// host path: padding mask, then Sampler::sample), the other describes its row
// (Sampler::add_device_row, which draws the same uniform) for the op. Over several steps, so
// the RNGs must stay in step too. Parameters are drawn at random with every one non-zero
// where it applies, at the real vocabulary of 151936 (with padding rows) and at small ones.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/sample/sample_row.h"
#include "engine/sample/sampler.h"
#include "engine/sample/vocabulary.h"
#include "kernels/cpu/cpu_backend.h"

namespace attnres {
namespace {

struct Case {
  SamplingParams params;
  std::vector<int32_t> prompt, output;
};

std::vector<int32_t> random_ids(std::mt19937_64& rng, int count, int32_t range) {
  // A small range next to the length makes repeats certain (penalties count them).
  std::uniform_int_distribution<int32_t> id(0, range - 1);
  std::vector<int32_t> ids(static_cast<size_t>(count));
  for (int32_t& x : ids) x = id(rng);
  return ids;
}

Case random_case(std::mt19937_64& rng, const Vocabulary& vocab) {
  auto pick = [&](auto... values) {
    const std::vector<std::common_type_t<decltype(values)...>> v{values...};
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  Case c;
  SamplingParams& p = c.params;
  p.seed = rng();
  p.temperature = pick(0.0f, 0.3f + 1.5f * unit(rng), 1.0f, 2.5f);
  p.top_k = pick(0, 1, 2, 7, 50, 1000, vocab.rows - 1, vocab.rows + 3);
  p.top_p = pick(1.0f, 1e-6f, 0.3f, 0.9f, 0.2f + 0.79f * unit(rng));
  p.min_p = pick(0.0f, 0.02f, 0.2f, unit(rng));
  p.repetition_penalty = pick(1.0f, 1.3f, 0.8f, 2.0f);
  p.presence_penalty = pick(0.0f, 0.7f, -1.5f);
  p.frequency_penalty = pick(0.0f, 0.4f, -0.9f, 2.0f);
  p.min_tokens = pick(0, 3, 100);
  p.stop_token_ids = random_ids(rng, pick(0, 1, 3), vocab.decodable);
  const int32_t range = std::min<int32_t>(vocab.decodable, pick(5, 40, vocab.decodable));
  c.prompt = random_ids(rng, pick(1, 9, 300), range);
  c.output = random_ids(rng, pick(0, 1, 6, 64), range);
  return c;
}

// Logits like a model's: a normal body, a few high ones, some exact ties.
std::vector<float> random_logits(std::mt19937_64& rng, int vocab) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(vocab));
  for (float& l : logits) l = normal(rng);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  for (int i = 0; i < 4; ++i) logits[id(rng)] = 12.0f + static_cast<float>(i % 2);  // ties
  for (int i = 0; i < vocab / 20; ++i) logits[id(rng)] = logits[id(rng)];
  return logits;
}

// One batch of rows through the host path and the op, `steps` times with each row's output
// growing by the token the host picked (both sides see the same history).
void check_batch(int vocab_rows, int decodable, int num_rows, int steps, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Vocabulary vocab{vocab_rows, decodable};
  const std::vector<int32_t> eos_ids = {decodable - 1, 0};
  std::vector<Case> cases;
  std::vector<std::unique_ptr<Sampler>> host, device;
  for (int r = 0; r < num_rows; ++r) {
    cases.push_back(random_case(rng, vocab));
    host.push_back(std::make_unique<Sampler>(cases[r].params, 1234 + r));
    device.push_back(std::make_unique<Sampler>(cases[r].params, 1234 + r));
  }
  auto backend = make_cpu_backend(3);
  for (int step = 0; step < steps; ++step) {
    Tensor logits = Tensor::empty({num_rows, vocab_rows}, DType::F32);
    SampleBatch batch;
    batch.decodable = decodable;
    std::vector<int32_t> expected(static_cast<size_t>(num_rows));
    for (int r = 0; r < num_rows; ++r) {
      std::vector<float> row = random_logits(rng, vocab_rows);
      std::copy(row.begin(), row.end(), logits.ptr<float>() + static_cast<int64_t>(r) * vocab_rows);
      vocab.mask_padding(row);
      expected[r] = host[r]->sample(row, cases[r].prompt, cases[r].output, eos_ids, nullptr);
      device[r]->add_device_row(cases[r].prompt, cases[r].output, eos_ids, batch);
    }
    std::vector<int32_t> got(static_cast<size_t>(num_rows), -100);
    backend->sample(logits, batch, got);
    for (int r = 0; r < num_rows; ++r) {
      const SamplingParams& p = cases[r].params;
      ASSERT_EQ(got[r], expected[r])
          << "vocab " << vocab_rows << " row " << r << " step " << step << ": temperature "
          << p.temperature << " top_k " << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p
          << " penalties " << p.repetition_penalty << "/" << p.presence_penalty << "/"
          << p.frequency_penalty << " min_tokens " << p.min_tokens << " outputs "
          << cases[r].output.size();
      cases[r].output.push_back(expected[r]);
    }
  }
}

TEST(CpuSample, MatchesTheHostSamplerAtTheRealVocabulary) { check_batch(151936, 151669, 24, 3, 1); }

TEST(CpuSample, MatchesTheHostSamplerAtSmallVocabularies) {
  for (uint64_t seed = 0; seed < 40; ++seed) {
    check_batch(64, 64, 16, 4, 100 + seed);
    check_batch(7, 5, 8, 4, 200 + seed);
    check_batch(1000, 990, 12, 3, 300 + seed);
  }
}

TEST(CpuSample, GreedyAndBlockedRowsPickWhatTheHostDoes) {
  // min_tokens blocks the argmax (an EOS id); top_k 1 is greedy on the processed logits.
  const std::vector<int32_t> eos_ids = {4};
  std::vector<float> logits = {0, 1, 2, 3, 9, 3, 2, 1, 0, -1};
  SampleBatch batch;
  batch.decodable = 10;
  for (float temperature : {0.0f, 1.0f}) {
    SamplingParams p;
    p.temperature = temperature;
    p.top_k = 1;
    p.min_tokens = 2;
    p.seed = 5;
    Sampler(p, 0).add_device_row({}, {}, eos_ids, batch);
  }
  Tensor t = Tensor::empty({2, 10}, DType::F32);
  for (int r = 0; r < 2; ++r) std::copy(logits.begin(), logits.end(), t.ptr<float>() + r * 10);
  std::vector<int32_t> got(2);
  make_cpu_backend(1)->sample(t, batch, got);
  EXPECT_EQ(got[0], 3);  // 4 blocked; 3 and 5 tie at 3: the lowest id wins
  EXPECT_EQ(got[1], 3);
}

TEST(CpuSample, RowsTheHostWouldRefuseGetTheirCodes) {
  const int vocab = 8;
  Tensor t = Tensor::empty({4, vocab}, DType::F32);
  float* x = t.ptr<float>();
  for (int i = 0; i < 4 * vocab; ++i) x[i] = static_cast<float>(i % 5);
  x[0 * vocab + 2] = std::numeric_limits<float>::quiet_NaN();
  x[1 * vocab + 7] = std::numeric_limits<float>::infinity();  // a padding row: still refused
  for (int i = 0; i < 6; ++i) x[2 * vocab + i] = -std::numeric_limits<float>::infinity();
  SampleBatch batch;
  batch.decodable = 6;
  SamplingParams sampled;
  sampled.seed = 1;
  sampled.min_tokens = 1;
  SamplingParams greedy = sampled;
  greedy.temperature = 0.0f;
  const std::vector<int32_t> every_decodable_id = {0, 1, 2, 3, 4, 5};
  Sampler(sampled, 0).add_device_row({}, {}, {}, batch);
  Sampler(sampled, 0).add_device_row({}, {}, {}, batch);
  Sampler(sampled, 0).add_device_row({}, {}, {}, batch);
  Sampler(sampled, 0).add_device_row({}, {}, every_decodable_id, batch);
  std::vector<int32_t> got(4);
  make_cpu_backend(2)->sample(t, batch, got);
  EXPECT_EQ(got[0], kSampleNonFiniteLogit);
  EXPECT_EQ(got[1], kSampleNonFiniteLogit);
  EXPECT_EQ(got[2], kSampleNoDecodableLogit);  // only padding rows are finite
  EXPECT_EQ(got[3], kSampleEveryLogitMasked);  // min_tokens blocks every decodable id
}

TEST(CpuSample, RefusesIdsOutsideTheBatch) {
  Tensor t = Tensor::empty({1, 8}, DType::F32);
  SampleBatch batch;
  batch.decodable = 8;
  batch.rows.emplace_back();
  batch.rows[0].blocked_count = 2;  // no ids in the batch
  std::vector<int32_t> got(1);
  EXPECT_THROW(make_cpu_backend(1)->sample(t, batch, got), std::logic_error);
  batch.token_ids = {3, 8};  // 8 is outside the vocabulary
  EXPECT_THROW(make_cpu_backend(1)->sample(t, batch, got), std::logic_error);
}

}  // namespace
}  // namespace attnres
