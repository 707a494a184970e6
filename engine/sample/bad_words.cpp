#include "engine/sample/bad_words.h"

#include <algorithm>
#include <limits>
#include <string>

#include "engine/core/error.h"

namespace attnres {

void block_bad_words(std::span<float> logits, const std::vector<std::vector<int32_t>>& bad_words,
                     std::span<const int32_t> output_ids) {
  for (const std::vector<int32_t>& word : bad_words) {
    if (word.empty()) continue;
    const size_t prefix = word.size() - 1;
    if (prefix > output_ids.size()) continue;  // the output is too short to hold the prefix
    if (!std::equal(word.begin(), word.begin() + static_cast<std::ptrdiff_t>(prefix),
                    output_ids.end() - static_cast<std::ptrdiff_t>(prefix))) {
      continue;
    }
    const int32_t last = word.back();
    ATTNRES_CHECK(last >= 0 && static_cast<size_t>(last) < logits.size(),
                  "bad word token id " + std::to_string(last) + " outside vocab " +
                      std::to_string(logits.size()));
    logits[static_cast<size_t>(last)] = -std::numeric_limits<float>::infinity();
  }
}

}  // namespace attnres
