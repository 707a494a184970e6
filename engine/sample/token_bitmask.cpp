#include "engine/sample/token_bitmask.h"

#include <algorithm>
#include <limits>

#include "engine/core/error.h"

namespace attnres {

void apply_token_bitmask(std::span<float> logits, std::span<const int32_t> bitmask) {
  const size_t rows = logits.size();
  ATTNRES_CHECK(
      bitmask.size() >= static_cast<size_t>(token_bitmask_words(static_cast<int32_t>(rows))),
      "token bitmask shorter than the logits row");
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (size_t word = 0; word * 32 < rows; ++word) {
    const uint32_t bits = static_cast<uint32_t>(bitmask[word]);
    if (bits == 0xffffffffu) continue;  // the common case inside a string: everything allowed
    const size_t end = std::min(rows, word * 32 + 32);
    for (size_t i = word * 32; i < end; ++i) {
      if (((bits >> (i % 32)) & 1u) == 0) logits[i] = kMasked;
    }
  }
}

bool any_token_allowed(std::span<const int32_t> bitmask, int32_t rows) {
  const int32_t full_words = rows / 32;
  for (int32_t w = 0; w < full_words; ++w) {
    if (bitmask[static_cast<size_t>(w)] != 0) return true;
  }
  for (int32_t id = full_words * 32; id < rows; ++id) {
    if (token_allowed(bitmask, id)) return true;
  }
  return false;
}

}  // namespace attnres
