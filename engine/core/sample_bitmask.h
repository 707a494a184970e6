// Where a SampleBatch row's structured-output bitmask lies (SampleRow::bitmask_row), checked
// once per call by Backend::sample (engine/core/backend.cpp) before a body reads any of it.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "engine/core/backend.h"
#include "engine/core/error.h"

namespace attnres {

// Words of one bitmask row over a vocabulary of `vocab` logits.
inline int64_t sample_bitmask_words(int64_t vocab) { return (vocab + 31) / 32; }

// Throws (a bug of the caller) unless batch.bitmask is whole rows of sample_bitmask_words(vocab)
// words and every row's bitmask_row is -1 or one of them. Returns the number of mask rows.
inline int64_t check_sample_bitmask(const SampleBatch& batch, int64_t vocab) {
  const int64_t words = sample_bitmask_words(vocab);
  const int64_t size = static_cast<int64_t>(batch.bitmask.size());
  ATTNRES_CHECK(words > 0 && size % words == 0,
                "sample: a bitmask of " + std::to_string(size) + " words is not whole rows of " +
                    std::to_string(words) + " (vocab " + std::to_string(vocab) + ")");
  const int64_t mask_rows = size / words;
  for (const SampleRow& row : batch.rows) {
    ATTNRES_CHECK(row.bitmask_row >= -1 && row.bitmask_row < mask_rows,
                  "sample: bitmask row " + std::to_string(row.bitmask_row) + " outside the " +
                      std::to_string(mask_rows) + " rows of the batch's bitmask");
  }
  return mask_rows;
}

// The row's mask words (empty when it has none); check_sample_bitmask first.
inline std::span<const int32_t> sample_row_bitmask(const SampleBatch& batch, const SampleRow& row,
                                                   int64_t vocab) {
  if (row.bitmask_row < 0) return {};
  const int64_t words = sample_bitmask_words(vocab);
  return std::span<const int32_t>(batch.bitmask)
      .subspan(static_cast<size_t>(row.bitmask_row * words), static_cast<size_t>(words));
}

}  // namespace attnres
