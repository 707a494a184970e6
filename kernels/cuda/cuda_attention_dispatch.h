// Which attention kernel computes which query rows of a step (pure host logic, made once per
// step in prepare_batch and used by every layer's attention).
//
// A sequence that brings at least kPrefillMinRows query rows (a prefill chunk) goes to the
// tensor-core prefill kernel (cuda_prefill_attention.cu) in tiles of kPrefillTileRows
// consecutive rows; every other row (decode rows, short chunks) goes to flash-decoding
// (cuda_attention.cu), which splits long contexts across CTAs and so keeps the GPU busy where
// a few query rows alone would not.
//
// Why 64: a tile computes 64 rows whatever it holds, so a chunk of n < 64 rows wastes
// (64 - n) / 64 of its tensor-core work, and the prefill kernel does not split the context:
// a chunk of 16 rows after a 4096-token prefix is 16 CTAs (one per query head) each walking
// 64 key tiles, where flash-decoding runs 16 x 8 CTAs x 4 splits. From one full tile on, the
// prefill kernel reads each K/V tile once per query head instead of once per query row and
// multiplies on tensor cores (~15x the f32 FMA rate). The crossover is to be measured on the
// GPU (bench_cuda_backend --only prefill-attention); this is the constant to tune.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cuda/cuda_kernels.h"

namespace attnres::cuda {

constexpr int kPrefillMinRows = 64;

struct AttentionDispatch {
  // Rows flash-decoding computes, in row order. Empty when there are no tiles: then every row
  // is flash-decoding's and the launch needs no row list (the decode-only path, as before).
  std::vector<int32_t> decode_rows;
  std::vector<PrefillTile> tiles;
  int decode_max_context = 0;  // the longest context of decode_rows (its split plan's)
};

// query_start [num_seqs + 1] and positions [T] as in BatchMeta (already validated).
// min_prefill_rows: the rows a sequence needs for the prefill kernel (kPrefillMinRows in the
// backend; tests pass 1 to send every row through it).
AttentionDispatch plan_attention_dispatch(std::span<const int32_t> query_start,
                                          std::span<const int32_t> positions,
                                          int min_prefill_rows = kPrefillMinRows);

}  // namespace attnres::cuda
