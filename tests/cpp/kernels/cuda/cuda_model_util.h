// Small models and step batches for the CUDA tests that run whole forwards (cuda_model_test,
// cuda_depth_weights_test, cuda_graph_test, cuda_batch_invariance_test).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/error.h"
#include "engine/model/model_config.h"

namespace attnres::test {

// mode: an attnres_mode ("" for a plain qwen3); gate / null_source: docs/ATTNRES.md §2d.
inline ModelConfig small_config(const std::string& mode, int layers, int blocks,
                                const std::string& gate = "bias", bool null_source = false) {
  const bool attnres = !mode.empty();
  nlohmann::json j = {{"model_type", attnres ? "qwen3_attnres" : "qwen3"},
                      {"hidden_size", 64},
                      {"intermediate_size", 96},
                      {"num_hidden_layers", layers},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 32},
                      {"vocab_size", 101},
                      {"max_position_embeddings", 256},
                      {"rms_norm_eps", 1e-6},
                      {"rope_theta", 10000.0},
                      {"tie_word_embeddings", true}};
  if (attnres) {
    j["attnres_mode"] = mode;
    j["attnres_num_blocks"] = blocks;
    j["attnres_gate_type"] = gate;
    j["attnres_use_null_source"] = null_source;
  }
  return ModelConfig::from_json(j, "cuda test config");
}

struct Seq {
  std::vector<int32_t> tokens;  // the whole sequence, prompt then generated
  std::vector<int32_t> table;
};

// The step that feeds tokens [begin[s], end[s]) of each sequence.
inline BatchMeta make_step(const std::vector<Seq>& seqs, const std::vector<int>& begin,
                           const std::vector<int>& end, int block_size,
                           std::vector<int32_t>& logit_rows) {
  BatchMeta b;
  b.query_start.push_back(0);
  logit_rows.clear();
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int p = begin[s]; p < end[s]; ++p) {
      b.token_ids.push_back(seqs[s].tokens[p]);
      b.positions.push_back(p);
      b.slot_mapping.push_back(seqs[s].table[p / block_size] * block_size + p % block_size);
    }
    b.query_start.push_back(static_cast<int32_t>(b.token_ids.size()));
    b.context_len.push_back(end[s]);
    b.block_tables.push_back(seqs[s].table);
    logit_rows.push_back(b.query_start.back() - 1);  // the last token of each sequence
  }
  b.num_tokens = static_cast<int>(b.token_ids.size());
  return b;
}

// Sequences of the given lengths with random tokens below `vocab` and disjoint block tables
// drawn in shuffled order from [0, num_blocks), each long enough for its whole sequence.
inline std::vector<Seq> random_sequences(const std::vector<int>& lengths, int block_size,
                                         int num_blocks, int vocab, std::mt19937& rng) {
  std::vector<int> free_blocks(num_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  std::uniform_int_distribution<int32_t> tok(0, vocab - 1);
  std::vector<Seq> seqs(lengths.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int i = 0; i < lengths[s]; ++i) seqs[s].tokens.push_back(tok(rng));
    for (int b = 0; b < (lengths[s] + block_size - 1) / block_size; ++b) {
      ATTNRES_CHECK(!free_blocks.empty(), "random_sequences: not enough KV blocks");
      seqs[s].table.push_back(free_blocks.back());
      free_blocks.pop_back();
    }
  }
  return seqs;
}

}  // namespace attnres::test
