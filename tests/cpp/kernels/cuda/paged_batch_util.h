// A step over a paged cache for the attention tests (cuda_attention_depth_test,
// cuda_flash_attention_test): each sequence has `cached` tokens in the cache already and
// computes `chunk` more, its block table drawn from shuffled block ids (non-contiguous).
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "engine/core/backend.h"

namespace attnres::test {

struct SeqSpec {
  int cached;  // tokens already in the cache before the step
  int chunk;   // tokens of this step (1: a decode row)
};

// Token ids are all 1 (attention never reads them). num_blocks must cover every sequence.
inline BatchMeta paged_batch(const std::vector<SeqSpec>& seqs, int block_size, int num_blocks,
                             std::mt19937& rng) {
  std::vector<int> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  BatchMeta batch;
  batch.query_start.push_back(0);
  int T = 0;
  for (const SeqSpec& s : seqs) {
    const int len = s.cached + s.chunk;
    std::vector<int32_t> table;
    for (int b = 0; b < (len + block_size - 1) / block_size; ++b) {
      table.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
    for (int p = s.cached; p < len; ++p) {
      batch.token_ids.push_back(1);
      batch.positions.push_back(p);
      batch.slot_mapping.push_back(table[p / block_size] * block_size + p % block_size);
    }
    T += s.chunk;
    batch.query_start.push_back(T);
    batch.context_len.push_back(len);
    batch.block_tables.push_back(table);
  }
  batch.num_tokens = T;
  return batch;
}

}  // namespace attnres::test
