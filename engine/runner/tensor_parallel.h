// How a model is split across the P ranks of a tensor-parallel group (Megatron-LM style):
//   column-parallel (output rows split):  q_proj, k_proj, v_proj, gate_proj, up_proj, lm_head
//   row-parallel (input columns split):   o_proj, down_proj (partial sums, then all-reduce)
//   replicated:                           embeddings, norms, q_norm / k_norm, AttnRes queries
// Attention heads are split with GQA respected: rank r takes query heads
// [r Hq/P, (r+1) Hq/P) and the KV heads they read. With fewer KV heads than ranks each KV head
// is replicated on the P/Hkv ranks whose query heads use it (vLLM's rule), so P must divide
// Hkv or be a multiple of it. The vocabulary is split in P slices of ceil(V/P) rows; the last
// slices are padded with zero rows (their logits are dropped when gathered).
//
// A rank computes with an ordinary ModelConfig whose head counts, intermediate size and
// vocabulary are its own (local_config), and an ordinary ModelWeights whose tensors are its
// slices (shard_weights), so Transformer and KvCache need no notion of parallelism beyond
// where to communicate.
#pragma once

#include <cstdint>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace attnres {

struct TensorParallelShard {
  int rank = 0;
  int size = 1;
  int num_heads = 0;      // query heads of this rank
  int first_head = 0;     // its first query head
  int num_kv_heads = 0;   // KV heads of this rank
  int first_kv_head = 0;  // its first KV head
  int intermediate = 0;   // MLP columns of this rank
  int first_intermediate = 0;
  int vocab_slice = 0;  // ceil(V / P): rows of every rank's LM head slice (padding included)
  int vocab_begin = 0;  // first real vocabulary row of this rank
  int vocab_end = 0;    // one past its last real row (vocab_begin when it holds none)
};

// Throws attnres::Error, naming the config field, when the model cannot be split `size` ways.
void check_tensor_parallel(const ModelConfig& config, int size);

// Rank `rank`'s part (check_tensor_parallel first).
TensorParallelShard shard_of(const ModelConfig& config, int rank, int size);

// The config a rank computes with: its head counts, intermediate size and vocabulary slice
// (vocab_size = the padded slice). Everything else is the model's.
ModelConfig local_config(const ModelConfig& config, const TensorParallelShard& shard);

// The rank's slices of the model's weights. Column-parallel slices are views of the full
// tensors (zero-copy: a memory-mapped checkpoint stays mapped, and only the rows this rank
// reads are ever paged in); row-parallel slices, padded LM head slices and sliced biases of
// row-parallel layers are new host tensors of the slice's size only. o_proj / down_proj biases
// stay on rank 0 alone (added once before the sum). Nothing is ever copied whole.
ModelWeights shard_weights(const ModelWeights& full, const ModelConfig& config,
                           const TensorParallelShard& shard);

}  // namespace attnres
