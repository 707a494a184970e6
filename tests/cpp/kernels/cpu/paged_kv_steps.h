// Shared by the CPU attention tests: sequences with a cached prefix and a chunk of new tokens,
// their K/V written into a paged cache in two steps as the engine would (the prefix, then the
// chunk under test).
#pragma once

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "engine/core/backend.h"

namespace attnres::test {

struct SeqSpec {
  int cached;  // tokens already in the cache before the step
  int chunk;   // tokens of this step (1: a decode)
};

// The step of tokens [0, cached) (prefix_step) or [cached, cached + chunk) of each sequence,
// with tables[s] its block table; their K/V rows (row = Hkv * hd floats, taken from k_all[s],
// v_all[s] by position) are stored into `cache`. Returns the step's BatchMeta.
inline BatchMeta store_paged_step(Backend& be, const std::vector<SeqSpec>& seqs,
                                  const std::vector<std::vector<int32_t>>& tables, int block_size,
                                  int row, const std::vector<Tensor>& k_all,
                                  const std::vector<Tensor>& v_all, KvCacheLayer& cache,
                                  bool prefix_step) {
  const int ns = static_cast<int>(seqs.size());
  BatchMeta b;
  b.query_start.push_back(0);
  for (int s = 0; s < ns; ++s) {
    const int begin = prefix_step ? 0 : seqs[s].cached;
    const int end = prefix_step ? seqs[s].cached : seqs[s].cached + seqs[s].chunk;
    for (int p = begin; p < end; ++p) {
      b.positions.push_back(p);
      b.slot_mapping.push_back(tables[s][p / block_size] * block_size + p % block_size);
      b.token_ids.push_back(0);
    }
    b.query_start.push_back(static_cast<int32_t>(b.positions.size()));
    b.context_len.push_back(end);
    b.block_tables.push_back(tables[s]);
  }
  b.num_tokens = static_cast<int>(b.positions.size());
  Tensor k = be.alloc({b.num_tokens, row}, DType::F32),
         v = be.alloc({b.num_tokens, row}, DType::F32);
  for (int s = 0; s < ns; ++s)
    for (int t = b.query_start[s]; t < b.query_start[s + 1]; ++t) {
      const int p = b.positions[t];
      std::copy_n(k_all[s].ptr<float>() + p * row, row, k.ptr<float>() + t * row);
      std::copy_n(v_all[s].ptr<float>() + p * row, row, v.ptr<float>() + t * row);
    }
  if (b.num_tokens > 0) be.store_kv(k, v, b, cache);
  return b;
}

// Block tables for `seqs` (each covering its cached prefix and chunk) drawn from `num_blocks`
// blocks in a shuffled order, so that no table is contiguous.
inline std::vector<std::vector<int32_t>> shuffled_block_tables(const std::vector<SeqSpec>& seqs,
                                                               int block_size, int num_blocks,
                                                               std::mt19937& rng) {
  std::vector<int> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  std::vector<std::vector<int32_t>> tables(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int len = seqs[s].cached + seqs[s].chunk;
    for (int b = 0; b < (len + block_size - 1) / block_size; ++b) {
      tables[s].push_back(free_blocks.back());
      free_blocks.pop_back();
    }
  }
  return tables;
}

// One sequence of one token at `position`, written to `slot` (its block table: `table`).
inline BatchMeta single_token_step(int position, int slot, std::vector<int32_t> table) {
  BatchMeta b;
  b.num_tokens = 1;
  b.positions = {position};
  b.slot_mapping = {slot};
  b.query_start = {0, 1};
  b.context_len = {position + 1};
  b.block_tables = {std::move(table)};
  return b;
}

}  // namespace attnres::test
