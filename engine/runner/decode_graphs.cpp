#include "engine/runner/decode_graphs.h"

#include <algorithm>
#include <string>

#include "engine/core/error.h"

namespace attnres {

int decode_graph_bucket(int n) {
  int bucket = 1;
  while (bucket < n) bucket *= 2;
  return bucket;
}

void check_decode_batch(const BatchMeta& batch, int vocab, int num_blocks, int block_size) {
  const int S = batch.num_seqs();
  ATTNRES_CHECK(batch.num_tokens == S && static_cast<int>(batch.token_ids.size()) == S &&
                    static_cast<int>(batch.positions.size()) == S &&
                    static_cast<int>(batch.slot_mapping.size()) == S &&
                    static_cast<int>(batch.query_start.size()) == S + 1 &&
                    static_cast<int>(batch.block_tables.size()) == S,
                "decode batch: one token per sequence expected");
  const int64_t slots = static_cast<int64_t>(num_blocks) * block_size;
  for (int s = 0; s < S; ++s) {
    // Built only for a message: this runs for every sequence of every replayed step.
    const auto where = [s] { return "decode batch, sequence " + std::to_string(s) + ": "; };
    ATTNRES_CHECK(batch.query_start[s] == s, where() + "query_start is not one token per sequence");
    const int32_t id = batch.token_ids[s], pos = batch.positions[s], ctx = batch.context_len[s];
    const int32_t slot = batch.slot_mapping[s];
    ATTNRES_CHECK(id >= 0 && id < vocab, where() + "token id " + std::to_string(id) +
                                             " outside the vocabulary of " + std::to_string(vocab));
    ATTNRES_CHECK(slot >= 0 && slot < slots, where() + "slot " + std::to_string(slot) +
                                                 " outside the cache's " + std::to_string(slots));
    ATTNRES_CHECK(pos >= 0 && pos < ctx, where() + "position " + std::to_string(pos) +
                                             " outside its context of " + std::to_string(ctx));
    const auto& table = batch.block_tables[s];
    ATTNRES_CHECK(static_cast<int64_t>(table.size()) * block_size >= ctx,
                  where() + "a context of " + std::to_string(ctx) + " tokens in " +
                      std::to_string(table.size()) + " blocks");
    const size_t used = static_cast<size_t>((ctx + block_size - 1) / block_size);
    for (size_t b = 0; b < used; ++b) {
      ATTNRES_CHECK(table[b] >= 0 && table[b] < num_blocks,
                    where() + "block id " + std::to_string(table[b]) + " outside the cache's " +
                        std::to_string(num_blocks));
    }
  }
}

int DecodeGraphs::padding_blocks(int max_batch, int block_size) {
  return (max_batch + block_size - 1) / block_size;
}

DecodeGraphs::DecodeGraphs(Transformer& model, KvCache& cache, int engine_blocks, int max_batch)
    : model_(model), cache_(cache), engine_blocks_(engine_blocks), max_batch_(max_batch) {
  ATTNRES_CHECK(max_batch >= 1, "decode graphs: max_batch must be at least 1");
  ATTNRES_CHECK(cache.num_blocks >= engine_blocks + padding_blocks(max_batch, cache.block_size),
                "decode graphs: the cache has no padding blocks past the engine's");
}

bool DecodeGraphs::takes(const BatchMeta& batch, std::span<const int32_t> head_rows,
                         bool wants_depth_weights) const {
  const int S = batch.num_seqs();
  if (S == 0 || S > max_batch_ || batch.num_tokens != S || wants_depth_weights) return false;
  if (static_cast<int>(head_rows.size()) != S) return false;
  for (int r = 0; r < S; ++r) {
    if (head_rows[r] != r) return false;
  }
  return true;
}

void DecodeGraphs::pad(const BatchMeta& batch, int rows, int width) {
  const int S = batch.num_seqs();
  const int bs = cache_.block_size;
  BatchMeta& p = padded_;
  p.num_tokens = rows;
  p.token_ids.assign(batch.token_ids.begin(), batch.token_ids.end());
  p.positions.assign(batch.positions.begin(), batch.positions.end());
  p.slot_mapping.assign(batch.slot_mapping.begin(), batch.slot_mapping.end());
  p.context_len.assign(batch.context_len.begin(), batch.context_len.end());
  p.query_start.resize(rows + 1);
  for (int r = 0; r <= rows; ++r) p.query_start[r] = r;
  p.block_tables.resize(rows);
  for (int s = 0; s < S; ++s) {
    std::vector<int32_t>& table = p.block_tables[s];
    table.assign(batch.block_tables[s].begin(), batch.block_tables[s].end());
    table.resize(width, engine_blocks_);  // never read: past the sequence's context
  }
  for (int j = 0; j < rows - S; ++j) {  // padding row j: its own slot of the padding blocks
    const int block = engine_blocks_ + j / bs, offset = j % bs;
    p.token_ids.push_back(0);
    p.positions.push_back(offset);
    p.slot_mapping.push_back(block * bs + offset);
    p.context_len.push_back(offset + 1);  // the padding rows 0..offset of its block
    p.block_tables[S + j].assign(width, block);
  }
}

Tensor DecodeGraphs::forward_padded(int rows) {
  std::vector<int32_t>& every_row = every_row_[rows];
  if (every_row.empty()) {
    every_row.resize(rows);
    for (int r = 0; r < rows; ++r) every_row[r] = r;
  }
  return model_.forward_hidden(padded_, cache_, every_row);
}

Tensor DecodeGraphs::run(const BatchMeta& batch) {
  const int S = batch.num_seqs();
  ATTNRES_CHECK(S >= 1 && S <= max_batch_, "decode graphs: a step of " + std::to_string(S) +
                                               " sequences (at most " +
                                               std::to_string(max_batch_) + ")");
  check_decode_batch(batch, model_.config().vocab_size, engine_blocks_, cache_.block_size);
  size_t longest = 1;
  for (const auto& table : batch.block_tables) longest = std::max(longest, table.size());
  const int rows = decode_graph_bucket(S);
  const int width = decode_graph_bucket(static_cast<int>(longest));
  pad(batch, rows, width);

  Graph& g = graphs_[{rows, width}];
  if (g.graph && g.graph->stale()) g.graph.reset();  // its staging was regrown: capture again
  if (!g.warmed_up || g.capture_failed) {
    g.warmed_up = true;
    return forward_padded(rows).rows(0, S);
  }
  Backend& backend = model_.backend();
  if (!g.graph) {
    try {
      g.graph = backend.capture_step_graph([&] { g.hidden = forward_padded(rows); });
    } catch (const std::exception& e) {
      // The backend stays usable after a failed capture: this bucket runs eagerly from now
      // on, and the reason is kept for whoever reports it.
      g.capture_failed = true;
      if (capture_error_.empty()) capture_error_ = e.what();
      return forward_padded(rows).rows(0, S);
    }
    ++captured_;
  } else {
    backend.prepare_batch(padded_);  // the replay's metadata copies read what this stages
  }
  g.graph->replay();
  ++replays_;
  return g.hidden.rows(0, S);
}

}  // namespace attnres
