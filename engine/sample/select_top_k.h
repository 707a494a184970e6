// Top-k selection over a vocabulary-sized score array, shared by top-k sampling and top
// logprobs: one pass with a k-sized heap, so no O(vocab) index array and no full sort.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace attnres {

// Writes into `out` the ids of the k highest scores, best first, ties by lowest id
// (k clamped to [0, scores.size()]). Scores must be NaN-free.
void select_top_k(std::span<const float> scores, int k, std::vector<int32_t>& out);

}  // namespace attnres
