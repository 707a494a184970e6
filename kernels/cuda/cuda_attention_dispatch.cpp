// See cuda_attention_dispatch.h.
#include "kernels/cuda/cuda_attention_dispatch.h"

#include <algorithm>

#include "engine/core/error.h"

namespace attnres::cuda {

AttentionDispatch plan_attention_dispatch(std::span<const int32_t> query_start,
                                          std::span<const int32_t> positions,
                                          int min_prefill_rows) {
  ATTNRES_CHECK(min_prefill_rows >= 1, "attention dispatch: min_prefill_rows must be >= 1");
  AttentionDispatch plan;
  const int num_seqs = static_cast<int>(query_start.size()) - 1;
  for (int s = 0; s < num_seqs; ++s) {
    const int32_t begin = query_start[s], end = query_start[s + 1];
    ATTNRES_CHECK(begin <= end && end <= static_cast<int32_t>(positions.size()),
                  "attention dispatch: query_start does not fit the positions");
    if (end - begin < min_prefill_rows) {
      for (int32_t t = begin; t < end; ++t) {
        plan.decode_rows.push_back(t);
        plan.decode_max_context = std::max(plan.decode_max_context, positions[t] + 1);
      }
      continue;
    }
    for (int32_t first = begin; first < end; first += kPrefillTileRows) {
      PrefillTile tile;
      tile.first_row = first;
      tile.num_rows = std::min(kPrefillTileRows, end - first);
      tile.seq = s;
      tile.key_end = 0;
      tile.min_position = INT32_MAX;
      for (int32_t t = first; t < first + tile.num_rows; ++t) {
        tile.key_end = std::max(tile.key_end, positions[t] + 1);
        tile.min_position = std::min(tile.min_position, positions[t]);
      }
      plan.tiles.push_back(tile);
    }
  }
  if (plan.tiles.empty()) plan.decode_rows.clear();  // every row: no list needed
  return plan;
}

}  // namespace attnres::cuda
