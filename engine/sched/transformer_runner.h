// The ModelRunner the server plugs into EngineCore: the real Transformer forward over a paged
// KvCache it owns. It samples batch.sample_rows on the model's backend (Backend::sample) and
// copies back to the host only the logits of batch.logit_rows.
#pragma once

#include <cstdint>
#include <vector>

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
  bool samples_on_device() const override { return true; }

  const KvCache& cache() const { return cache_; }

 private:
  Transformer& model_;
  KvCache cache_;
  std::vector<int32_t> head_rows_;  // the LM head's rows: sample_rows, then logit_rows
};

}  // namespace attnres
