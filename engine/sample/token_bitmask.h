// The allowed-token bitmask of structured output: one bit per logits row, packed into int32
// words (bit i % 32 of word i / 32; set = allowed), xgrammar's layout, so a row of V logits
// takes (V + 31) / 32 words.
#pragma once

#include <cstdint>
#include <span>

namespace attnres {

inline int32_t token_bitmask_words(int32_t rows) { return (rows + 31) / 32; }

inline bool token_allowed(std::span<const int32_t> bitmask, int32_t id) {
  return (static_cast<uint32_t>(bitmask[static_cast<size_t>(id / 32)]) >> (id % 32)) & 1u;
}

// logits [V]: every row whose bit is clear becomes -inf. bitmask: token_bitmask_words(V) words.
void apply_token_bitmask(std::span<float> logits, std::span<const int32_t> bitmask);

// Whether any of ids [0, rows) is allowed.
bool any_token_allowed(std::span<const int32_t> bitmask, int32_t rows);

}  // namespace attnres
