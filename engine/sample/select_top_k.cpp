#include "engine/sample/select_top_k.h"

#include <algorithm>

namespace attnres {

void select_top_k(std::span<const float> scores, int k, std::vector<int32_t>& out) {
  const int32_t n = static_cast<int32_t>(scores.size());
  k = std::clamp(k, 0, n);
  out.resize(k);
  if (k == 0) return;
  // "a ranks before b": larger score, then lower id. As a heap comparator this keeps the
  // worst selected id on top, the one a better newcomer replaces.
  auto ranks_before = [&](int32_t a, int32_t b) {
    return scores[a] > scores[b] || (scores[a] == scores[b] && a < b);
  };
  for (int32_t i = 0; i < k; ++i) out[i] = i;
  std::make_heap(out.begin(), out.end(), ranks_before);
  for (int32_t i = k; i < n; ++i) {
    if (!ranks_before(i, out.front())) continue;
    std::pop_heap(out.begin(), out.end(), ranks_before);
    out.back() = i;
    std::push_heap(out.begin(), out.end(), ranks_before);
  }
  std::sort_heap(out.begin(), out.end(), ranks_before);  // best first
}

}  // namespace attnres
