// The host side of the CUDA sampling tests (cuda_sampling_test.cpp,
// cuda_sampling_bitmask_test.cpp): a row's case, model-like logits, the host's processing of a
// row up to its distribution, and whether a draw lies so close to a boundary of that
// distribution that f32 rounding may legitimately move it. Tolerance (kernels/cuda/NOTES.md,
// "Sampling"): the GPU sums a row's CDF in fixed point, the host in doubles of the f32 weights,
// so a random row must match unless the host's uniform, top-p cut or min-p threshold lies
// within kBoundary of a boundary of its distribution.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/sample/logits_processors.h"
#include "engine/sample/sampler.h"
#include "engine/sample/token_bitmask.h"
#include "engine/sample/truncated_distribution.h"

namespace attnres::test::sampling {

inline constexpr double kBoundary = 1e-5;

// One row's request: its parameters, its prompt and output ids, and its structured-output
// mask (token_bitmask.h's words; empty: the row has none).
struct RowCase {
  SamplingParams params;
  std::vector<int32_t> prompt, output;
  std::vector<int32_t> mask;
};

// Normal logits with 30 high ones, some tied.
inline std::vector<float> model_like_logits(std::mt19937_64& rng, int vocab) {
  std::normal_distribution<float> body(0.0f, 2.5f);
  std::vector<float> row(vocab);
  for (float& l : row) l = body(rng);
  std::uniform_int_distribution<int> id(0, vocab - 1);
  for (int i = 0; i < 30; ++i) row[id(rng)] = 9.0f + static_cast<float>(i % 7) * 0.5f;  // ties
  return row;
}

// The host's processed row: the padding past `decodable` and the mask removed, the EOS and
// stop ids blocked below min_tokens, the penalties and the temperature (Sampler::sample up to
// the distribution).
inline std::vector<float> processed(std::vector<float> row, const RowCase& c,
                                    const std::vector<int32_t>& eos_ids, int decodable) {
  std::fill(row.begin() + decodable, row.end(), -INFINITY);
  if (!c.mask.empty()) apply_token_bitmask(row, c.mask);
  if (static_cast<int>(c.output.size()) < c.params.min_tokens) {
    block_tokens(row, eos_ids);
    block_tokens(row, c.params.stop_token_ids);
  }
  PenaltyScratch scratch;
  apply_penalties(
      row, c.prompt, c.output,
      {c.params.repetition_penalty, c.params.presence_penalty, c.params.frequency_penalty},
      scratch);
  apply_temperature(row, c.params.temperature);
  return row;
}

inline bool near(const std::vector<double>& cdf, double x) {
  return std::any_of(cdf.begin(), cdf.end(),
                     [&](double b) { return std::fabs(b - x) < kBoundary; });
}

// Whether rounding may legitimately move this row's draw with uniform u (the file comment).
// A row with nothing left to sample has no boundary.
inline bool near_a_boundary(const std::vector<float>& raw, const RowCase& c, double u,
                            const std::vector<int32_t>& eos_ids, int decodable) {
  const SamplingParams& p = c.params;
  std::vector<float> row = processed(raw, c, eos_ids, decodable);
  if (*std::max_element(row.begin(), row.end()) == -INFINITY) return false;
  TruncatedDistribution final_dist;
  final_dist.build(row, {p.top_k, p.top_p, p.min_p});
  std::vector<double> cdf;
  double sum = 0;
  for (const auto& [id, prob] : final_dist.probabilities()) cdf.push_back(sum += prob);
  if (near(cdf, u)) return true;
  row = processed(raw, c, eos_ids, decodable);
  TruncatedDistribution before_top_p;
  before_top_p.build(row, {p.top_k, 1.0f, 0.0f});
  auto probs = before_top_p.probabilities();
  std::sort(probs.begin(), probs.end(), [](const auto& a, const auto& b) {
    return a.second > b.second || (a.second == b.second && a.first < b.first);
  });
  cdf.clear();
  sum = 0;
  for (const auto& [id, prob] : probs) cdf.push_back(sum += prob);
  if (p.top_p < 1.0f && near(cdf, p.top_p)) return true;
  if (p.min_p > 0.0f) {
    for (const auto& [id, prob] : probs) {
      if (std::fabs(prob / probs.front().second - p.min_p) < kBoundary) return true;
    }
  }
  return false;
}

}  // namespace attnres::test::sampling
