// Shared helpers for the sampling tests: reproducible random logits.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace attnres::testing {

// Normally distributed logits; the test RNG only needs to be deterministic on this platform.
inline std::vector<float> random_logits(size_t vocab, float stddev, uint32_t seed,
                                        float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, stddev);
  std::vector<float> logits(vocab);
  for (float& l : logits) l = normal(rng);
  return logits;
}

}  // namespace attnres::testing
