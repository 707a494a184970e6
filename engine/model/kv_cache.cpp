#include "engine/model/kv_cache.h"

#include "engine/core/error.h"

namespace attnres {

size_t KvCache::bytes_per_block(const ModelConfig& config, int block_size, DType dtype) {
  return 2ull * config.num_layers * block_size * config.num_kv_heads * config.head_dim *
         dtype_size(dtype);
}

int KvCache::blocks_for_budget(const ModelConfig& config, int block_size, size_t budget_bytes,
                               DType dtype) {
  return static_cast<int>(budget_bytes / bytes_per_block(config, block_size, dtype));
}

KvCache KvCache::allocate(Backend& backend, const ModelConfig& config, int num_blocks,
                          int block_size, DType dtype) {
  if (num_blocks <= 0 || block_size <= 0) {
    throw Error("KV cache needs at least one block (got " + std::to_string(num_blocks) +
                " blocks of " + std::to_string(block_size) + " tokens)");
  }
  if (!backend.capabilities().kv_cache_dtypes.contains(dtype)) {
    throw Error("KV cache: the " + backend.name() + " backend has no " + storage_dtype_name(dtype) +
                " KV cache");
  }
  KvCache cache;
  cache.num_blocks = num_blocks;
  cache.block_size = block_size;
  cache.dtype = dtype;
  Shape shape{num_blocks, block_size, config.num_kv_heads, config.head_dim};
  for (int i = 0; i < config.num_layers; ++i) {
    cache.layers.push_back(KvCacheLayer{backend.alloc(shape, dtype), backend.alloc(shape, dtype)});
  }
  return cache;
}

}  // namespace attnres
