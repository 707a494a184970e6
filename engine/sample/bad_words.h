// vLLM's bad_words as a logits processor: each bad word is a token-id sequence that must never
// appear in the output. Before each token, for every sequence whose all-but-last ids equal the
// end of the output so far, its last id is blocked (-inf). A one-token word is therefore always
// blocked; a longer one only where the output already holds its prefix, so the tokens of a
// word stay usable elsewhere. Like vLLM, only the output is matched (a prefix that ends the
// prompt does not count). O(total ids of the bad words) per token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace attnres {

void block_bad_words(std::span<float> logits, const std::vector<std::vector<int32_t>>& bad_words,
                     std::span<const int32_t> output_ids);

}  // namespace attnres
