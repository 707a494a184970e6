// block_bad_words against a brute-force reference (token t is blocked exactly when output + [t]
// ends with some bad word), and the Sampler end to end: over many seeds no bad word is ever
// generated, and a sequence with bad words is sampled on the host.
#include "engine/sample/bad_words.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "engine/core/error.h"
#include "engine/sample/sample_row.h"
#include "engine/sample/sampler.h"
#include "test_logits.h"

namespace attnres {
namespace {

// Whether `ids` ends with `word`.
bool ends_with(const std::vector<int32_t>& ids, const std::vector<int32_t>& word) {
  return word.size() <= ids.size() && std::equal(word.rbegin(), word.rend(), ids.rbegin());
}

TEST(BadWordsTest, BlocksExactlyTheTokensThatWouldCompleteABadWord) {
  constexpr int32_t kVocab = 6;  // a small vocabulary so that prefixes match often
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(0, kVocab - 1);
  std::uniform_int_distribution<int> length(1, 3);
  for (int trial = 0; trial < 500; ++trial) {
    std::vector<std::vector<int32_t>> bad_words(static_cast<size_t>(1 + trial % 4));
    for (auto& word : bad_words) {
      word.resize(static_cast<size_t>(length(rng)));
      for (int32_t& id : word) id = token(rng);
    }
    std::vector<int32_t> output(static_cast<size_t>(trial % 5));
    for (int32_t& id : output) id = token(rng);

    std::vector<float> logits = testing::random_logits(kVocab, 1.0f, static_cast<uint32_t>(trial));
    const std::vector<float> before = logits;
    block_bad_words(logits, bad_words, output);
    for (int32_t t = 0; t < kVocab; ++t) {
      std::vector<int32_t> extended = output;
      extended.push_back(t);
      const bool completes = std::any_of(bad_words.begin(), bad_words.end(),
                                         [&](const auto& w) { return ends_with(extended, w); });
      if (completes) {
        EXPECT_EQ(logits[t], -INFINITY) << "trial " << trial << " token " << t;
      } else {
        EXPECT_EQ(logits[t], before[t]) << "trial " << trial << " token " << t;
      }
    }
  }
}

TEST(BadWordsTest, OnlyTheOutputIsMatched) {
  // The prefix [1] ends the prompt but not the (empty) output: nothing is blocked, as in vLLM.
  std::vector<float> logits(4, 0.0f);
  block_bad_words(logits, {{1, 2}}, {});
  EXPECT_TRUE(std::all_of(logits.begin(), logits.end(), [](float l) { return l == 0.0f; }));
  block_bad_words(logits, {{1, 2}}, std::vector<int32_t>{3, 1});
  EXPECT_EQ(logits[2], -INFINITY);
  EXPECT_EQ(logits[1], 0.0f);
}

TEST(BadWordsTest, SamplerNeverGeneratesABadWordOverManySeeds) {
  constexpr size_t kVocab = 8;
  // Flat logits: without the processor each word would appear within a few tokens.
  const std::vector<float> flat(kVocab, 0.0f);
  SamplingParams p;
  p.temperature = 1.0f;
  p.bad_words = {{3}, {5, 6}, {1, 2, 1}};
  EXPECT_FALSE(can_sample_on_device(p));
  int prefix_seen = 0;
  for (uint64_t seed = 0; seed < 50; ++seed) {
    p.seed = seed;
    Sampler sampler(p, 0);
    std::vector<int32_t> output;
    for (int i = 0; i < 60; ++i) {
      std::vector<float> logits = flat;
      output.push_back(sampler.sample(logits, {}, output, {}, nullptr));
      for (const auto& word : p.bad_words) {
        ASSERT_FALSE(ends_with(output, word)) << "seed " << seed << " step " << i;
      }
      if (ends_with(output, {5}) || ends_with(output, {1, 2})) ++prefix_seen;
    }
  }
  // The prefixes themselves stay allowed (only their completion is blocked).
  EXPECT_GT(prefix_seen, 100);
}

TEST(BadWordsTest, ValidateRejectsEmptyWordsAndUnknownIds) {
  const Vocabulary vocabulary = Vocabulary::all_rows(16);
  SamplingParams p;
  p.bad_words = {{1, 2}};
  EXPECT_NO_THROW(p.validate(vocabulary));
  p.bad_words = {{1}, {}};
  EXPECT_THROW(p.validate(vocabulary), Error);
  p.bad_words = {{1, 99}};
  EXPECT_THROW(p.validate(vocabulary), Error);
}

}  // namespace
}  // namespace attnres
