// The paged KV cache: per layer, K and V pools of fixed-size blocks
// [num_blocks, block_size, num_kv_heads, head_dim] on the backend's device, in F32 or BF16
// (--kv-cache-dtype; a BF16 cache holds twice the tokens in the same memory, and the backend
// rounds K/V to nearest even when it stores them). Which block belongs to which sequence is the
// block manager's business (engine/sched); this file only owns the memory.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/model/model_config.h"

namespace attnres {

struct KvCache {
  int num_blocks = 0;
  int block_size = 0;
  DType dtype = DType::F32;
  std::vector<KvCacheLayer> layers;

  // Throws if the backend cannot run attention over a cache of `dtype`
  // (BackendCapabilities::kv_cache_dtypes).
  static KvCache allocate(Backend& backend, const ModelConfig& config, int num_blocks,
                          int block_size, DType dtype = DType::F32);
  // Bytes one block takes across all layers (K and V).
  static size_t bytes_per_block(const ModelConfig& config, int block_size,
                                DType dtype = DType::F32);
  // Blocks that fit in a memory budget.
  static int blocks_for_budget(const ModelConfig& config, int block_size, size_t budget_bytes,
                               DType dtype = DType::F32);
};

}  // namespace attnres
