// Decode steps as step graphs (Backend::capture_step_graph): on a GPU a 0.6B decode step is
// ~440 small launches, over the whole step's memory-bound budget, and a replayed graph pays
// one. A graph replays fixed shapes, so each decode step is padded to a bucket:
// - rows: the next power of two of the step's sequences (1, 2, 4, ... max_batch);
// - block-table width: the next power of two of its longest table (the attention kernel
//   reads only context_len of it, so padding costs a few bytes of metadata).
// One graph per (rows, width), captured on the bucket's second step (the first runs eagerly
// with the same padding, so every buffer the step allocates is cached before the capture),
// then replayed: the runner rewrites one static padded batch, prepare_batch stages it, and
// the replay's metadata copies read it.
//
// Padding rows compute a throwaway token each: padding row j writes its K/V into a slot of
// the cache's padding blocks (past the engine's blocks, never handed to a sequence), j's own
// slot so no two rows write one slot, and attends over that padding block. Rows are
// independent in every op, so real rows do not see them.
//
// The graph holds the forward up to the final norm; the LM head runs eagerly on its rows
// (Transformer::lm_head): the logits buffer, [rows, vocab], would otherwise be held once per
// graph (~155 MB at 256 rows of a 151936-token vocabulary).
//
// A replay runs none of the ops' host checks, so check_decode_batch does them here for every
// replayed step. Only what a graph cannot replay runs eagerly: prefill chunks, steps asking
// for depth weights, steps wider than max_batch.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/backend.h"
#include "engine/model/kv_cache.h"
#include "engine/model/transformer.h"
#include "engine/runner/model_runner.h"

namespace attnres {

// The bucket sizes: the next power of two of n (n >= 1).
int decode_graph_bucket(int n);

// Fails (an internal error: the engine built a bad batch) naming the first entry of a decode
// batch (one token per sequence) that the ops' host checks would refuse: a token id outside [0,
// vocab), a slot outside the engine's blocks, a block id outside them, a position outside its
// context, a context longer than the block table holds.
void check_decode_batch(const BatchMeta& batch, int vocab, int num_blocks, int block_size);

class DecodeGraphs {
 public:
  // Padding blocks the cache needs past the engine's for max_batch rows.
  static int padding_blocks(int max_batch, int block_size);

  // `cache` holds engine_blocks blocks for the engine, then padding_blocks(max_batch, ...).
  DecodeGraphs(Transformer& model, KvCache& cache, int engine_blocks, int max_batch);

  // Whether a step runs as a graph: every sequence computes one token, the rows its LM head
  // reads (head_rows: sampled on the device, then copied back) are every row in order, no
  // depth weights, at most max_batch sequences.
  bool takes(const BatchMeta& batch, std::span<const int32_t> head_rows,
             bool wants_depth_weights) const;

  // Runs a step takes() accepted (eagerly while its bucket warms up) and returns the final
  // hidden rows [num_seqs, d] on the device, a view valid until the next run().
  Tensor run(const BatchMeta& batch);

  int max_batch() const { return max_batch_; }
  int graphs_captured() const { return captured_; }
  int replays() const { return replays_; }
  // Why the first capture that failed did (its bucket runs eagerly); empty when none did.
  const std::string& capture_error() const { return capture_error_; }

 private:
  struct Graph {
    bool warmed_up = false;
    bool capture_failed = false;
    std::unique_ptr<StepGraph> graph;
    Tensor hidden;  // [rows, d]: what the recorded forward returned (the graph writes it)
  };
  void pad(const BatchMeta& batch, int rows, int width);
  Tensor forward_padded(int rows);

  Transformer& model_;
  KvCache& cache_;
  int engine_blocks_;
  int max_batch_;
  BatchMeta padded_;  // the static input every graph reads: rewritten before each run
  std::map<int, std::vector<int32_t>> every_row_;  // logit rows 0..rows-1, per bucket
  std::map<std::pair<int, int>, Graph> graphs_;    // by (rows, width)
  int captured_ = 0;
  int replays_ = 0;
  std::string capture_error_;
};

}  // namespace attnres
