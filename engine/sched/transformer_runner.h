// The ModelRunner the server plugs into EngineCore: the real Transformer forward over a paged
// KvCache it owns, with the logits copied back to the host for sampling.
#pragma once

#include "engine/model/kv_cache.h"
#include "engine/model/transformer.h"
#include "engine/sched/model_runner.h"

namespace attnres {

class TransformerRunner : public ModelRunner {
 public:
  // Allocates num_blocks blocks of block_size tokens on the model's backend; give the engine
  // the same numbers (EngineConfig::num_kv_blocks / block_size).
  // kv_dtype: F32, or BF16 where the backend takes it (KvCache::allocate).
  TransformerRunner(Transformer& model, int num_blocks, int block_size,
                    DType kv_dtype = DType::F32);

  int vocab_size() const override;
  void execute(const StepBatch& batch, StepResult& result) override;
  DepthAttentionLayout depth_attention_layout() const override;

  const KvCache& cache() const { return cache_; }

 private:
  Transformer& model_;
  KvCache cache_;
};

}  // namespace attnres
