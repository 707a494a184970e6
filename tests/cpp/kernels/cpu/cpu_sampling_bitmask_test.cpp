// CpuBackend::sample with structured-output bitmasks (SampleRow::bitmask_row) against the
// engine's host path for a constrained row, bit for bit: padding mask, the constraint's
// apply_token_bitmask (engine/sample/token_bitmask.h), then the host Sampler. Masks of every
// density (one id, a few, most, all), rows without one in the same batch, stray bits past the
// vocabulary in the last word, and a mask that leaves only padding ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "engine/core/error.h"
#include "engine/core/sample_bitmask.h"
#include "engine/sample/sample_row.h"
#include "engine/sample/sampler.h"
#include "engine/sample/token_bitmask.h"
#include "engine/sample/vocabulary.h"
#include "kernels/cpu/cpu_backend.h"

namespace attnres {
namespace {

// A mask row over `rows` ids allowing each with probability `density` (at least one decodable
// id unless only_padding), with random bits past the vocabulary.
std::vector<int32_t> random_mask(std::mt19937_64& rng, int rows, int decodable, double density,
                                 bool only_padding) {
  std::vector<int32_t> words(static_cast<size_t>(token_bitmask_words(rows)), 0);
  auto set = [&](int id) {
    words[static_cast<size_t>(id / 32)] |= static_cast<int32_t>(1u << (id % 32));
  };
  std::bernoulli_distribution allow(density);
  for (int id = only_padding ? decodable : 0; id < rows; ++id) {
    if (allow(rng)) set(id);
  }
  if (!only_padding) set(std::uniform_int_distribution<int>(0, decodable - 1)(rng));
  for (int id = rows; id < static_cast<int>(words.size()) * 32; ++id) {
    if (rng() & 1) set(id);  // never read
  }
  return words;
}

void check_masked_batch(int vocab_rows, int decodable, int num_rows, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const Vocabulary vocab{vocab_rows, decodable};
  const std::vector<int32_t> eos_ids = {decodable - 1};
  std::normal_distribution<float> logit(0.0f, 3.0f);
  Tensor logits = Tensor::empty({num_rows, vocab_rows}, DType::F32);
  SampleBatch batch;
  batch.decodable = decodable;
  std::vector<int32_t> expected(static_cast<size_t>(num_rows));
  for (int r = 0; r < num_rows; ++r) {
    SamplingParams p;
    p.seed = rng();
    p.temperature = std::vector<float>{0.0f, 0.6f, 1.0f, 1.8f}[r % 4];
    p.top_k = std::vector<int>{0, 3, 40}[rng() % 3];
    p.top_p = std::vector<float>{1.0f, 0.8f}[rng() % 2];
    p.min_p = std::vector<float>{0.0f, 0.1f}[rng() % 2];
    p.repetition_penalty = std::vector<float>{1.0f, 1.3f}[rng() % 2];
    p.frequency_penalty = std::vector<float>{0.0f, 0.5f}[rng() % 2];
    p.min_tokens = std::vector<int>{0, 5}[rng() % 2];
    std::vector<int32_t> prompt, output;
    for (int i = 0; i < 12; ++i) prompt.push_back(static_cast<int32_t>(rng() % decodable));
    for (int i = 0; i < 3; ++i) output.push_back(static_cast<int32_t>(rng() % decodable));

    std::vector<float> row(static_cast<size_t>(vocab_rows));
    for (float& l : row) l = logit(rng);
    std::copy(row.begin(), row.end(), logits.ptr<float>() + static_cast<int64_t>(r) * vocab_rows);
    // Every sixth row has no mask; the others run from one id to all of them.
    const int kind = r % 6;
    std::vector<int32_t> mask;
    if (kind != 0) {
      const double density = std::vector<double>{0.0, 0.01, 0.3, 0.95, 1.0}[kind - 1];
      mask = random_mask(rng, vocab_rows, decodable, density, r == 7);
    }

    // The host path (SequenceOutput::next): padding mask, the constraint's mask, the sampler.
    Sampler host(p, 99);
    vocab.mask_padding(row);
    if (!mask.empty()) apply_token_bitmask(row, mask);
    try {
      expected[r] = host.sample(row, prompt, output, eos_ids, nullptr);
    } catch (const std::logic_error&) {
      expected[r] = kSampleEveryLogitMasked;  // "every logit is -inf"
    }

    Sampler(p, 99).add_device_row(prompt, output, eos_ids, batch);
    if (!mask.empty()) {
      batch.rows.back().bitmask_row = static_cast<int32_t>(batch.bitmask.size() / mask.size());
      batch.bitmask.insert(batch.bitmask.end(), mask.begin(), mask.end());
    }
  }
  std::vector<int32_t> got(static_cast<size_t>(num_rows), -100);
  make_cpu_backend(3)->sample(logits, batch, got);
  for (int r = 0; r < num_rows; ++r) {
    EXPECT_EQ(got[r], expected[r]) << "vocab " << vocab_rows << " row " << r << " seed " << seed;
  }
}

TEST(CpuSampleBitmask, MatchesTheHostPathsMaskingAtTheRealVocabulary) {
  check_masked_batch(151936, 151669, 12, 1);
}

TEST(CpuSampleBitmask, MatchesTheHostPathsMaskingAtSmallAndOddVocabularies) {
  for (uint64_t seed = 0; seed < 30; ++seed) {
    check_masked_batch(64, 60, 12, 10 + seed);
    check_masked_batch(37, 33, 12, 100 + seed);
    check_masked_batch(1000, 990, 12, 200 + seed);
  }
}

TEST(CpuSampleBitmask, AMaskAllowingOneIdPicksItAtAnyLogit) {
  // Greedy and random rows whose mask allows only id 5 of 40: both must pick 5, though its
  // logit is the lowest.
  const int vocab = 40;
  Tensor t = Tensor::empty({2, vocab}, DType::F32);
  for (int i = 0; i < 2 * vocab; ++i) t.ptr<float>()[i] = static_cast<float>(i % vocab);
  SampleBatch batch;
  batch.decodable = vocab;
  batch.rows.resize(2);
  batch.rows[0].greedy = true;
  batch.rows[1].uniform = 0.999;
  batch.rows[0].bitmask_row = 1;  // rows of the bitmask in any order
  batch.rows[1].bitmask_row = 0;
  batch.bitmask = {1 << 5, 0, 1 << 5, 0};
  std::vector<int32_t> got(2);
  make_cpu_backend(1)->sample(t, batch, got);
  EXPECT_EQ(got, (std::vector<int32_t>{5, 5}));
}

TEST(CpuSampleBitmask, RefusesABitmaskThatIsNotWholeRowsOrARowOutsideIt) {
  Tensor t = Tensor::empty({1, 40}, DType::F32);
  std::fill_n(t.ptr<float>(), 40, 1.0f);
  SampleBatch batch;
  batch.decodable = 40;
  batch.rows.emplace_back();
  batch.rows[0].bitmask_row = 0;
  std::vector<int32_t> got(1);
  batch.bitmask = {-1, -1, -1};  // 40 ids take 2 words a row
  EXPECT_THROW(make_cpu_backend(1)->sample(t, batch, got), std::logic_error);
  batch.bitmask = {-1, -1};
  batch.rows[0].bitmask_row = 1;
  EXPECT_THROW(make_cpu_backend(1)->sample(t, batch, got), std::logic_error);
  batch.rows[0].bitmask_row = 0;
  make_cpu_backend(1)->sample(t, batch, got);
  EXPECT_EQ(got[0], 0);
  EXPECT_EQ(check_sample_bitmask(batch, 40), 1);
}

}  // namespace
}  // namespace attnres
