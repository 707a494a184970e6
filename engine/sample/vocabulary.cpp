#include "engine/sample/vocabulary.h"

#include <algorithm>
#include <limits>

#include "engine/core/error.h"

namespace attnres {

Vocabulary Vocabulary::of(int model_rows, int tokenizer_size) {
  return {model_rows, std::clamp(tokenizer_size, 0, model_rows)};
}

void Vocabulary::check(const std::string& field, int32_t id) const {
  if (contains(id)) return;
  const std::string got = "field " + field + ": got " + std::to_string(id) + ", expected ";
  if (id < 0 || id >= rows) throw Error(got + "a token id in [0, " + std::to_string(rows) + ")");
  throw Error(got + "a token id in [0, " + std::to_string(decodable) + ") (token id " +
              std::to_string(id) + " is a padding row of the model's vocabulary of " +
              std::to_string(rows) + ": the tokenizer has no token for it)");
}

void Vocabulary::mask_padding(std::span<float> logits) const {
  const size_t begin = std::min(static_cast<size_t>(decodable), logits.size());
  std::fill(logits.begin() + static_cast<std::ptrdiff_t>(begin), logits.end(),
            -std::numeric_limits<float>::infinity());
}

}  // namespace attnres
