#include "engine/sched/transformer_runner.h"

namespace attnres {

TransformerRunner::TransformerRunner(Transformer& model, int num_blocks, int block_size,
                                     DType kv_dtype)
    : model_(model),
      cache_(KvCache::allocate(model.backend(), model.config(), num_blocks, block_size, kv_dtype)) {
}

int TransformerRunner::vocab_size() const { return model_.config().vocab_size; }

void TransformerRunner::execute(const StepBatch& batch, StepResult& result) {
  result.sampled_ids.clear();  // sampled on the host
  result.depth_weights.clear();
  const DepthWeightsRequest depth{batch.depth_rows, &result.depth_weights};
  Tensor device_logits = model_.forward(batch.meta, cache_, batch.logit_rows,
                                        batch.wants_depth_weights() ? &depth : nullptr);
  result.logits.resize(static_cast<size_t>(device_logits.numel()));
  // A step with only non-final prefill chunks asks for no logits.
  if (!result.logits.empty()) model_.backend().download(device_logits, result.logits.data());
}

DepthAttentionLayout TransformerRunner::depth_attention_layout() const {
  return model_.depth_attention_layout();
}

}  // namespace attnres
