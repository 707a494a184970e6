#include "engine/sched/transformer_runner.h"

namespace attnres {

TransformerRunner::TransformerRunner(Transformer& model, int num_blocks, int block_size)
    : model_(model),
      cache_(KvCache::allocate(model.backend(), model.config(), num_blocks, block_size)) {}

int TransformerRunner::vocab_size() const { return model_.config().vocab_size; }

void TransformerRunner::execute(const BatchMeta& batch, std::span<const int32_t> logit_rows,
                                std::vector<float>& logits) {
  run(batch, logit_rows, logits, nullptr);
}

void TransformerRunner::run(const BatchMeta& batch, std::span<const int32_t> logit_rows,
                            std::vector<float>& logits, const DepthWeightsRequest* depth) {
  Tensor device_logits = model_.forward(batch, cache_, logit_rows, depth);
  logits.resize(static_cast<size_t>(device_logits.numel()));
  // A step with only non-final prefill chunks asks for no logits.
  if (!logits.empty()) model_.backend().download(device_logits, logits.data());
}

DepthAttentionLayout TransformerRunner::depth_attention_layout() const {
  return model_.depth_attention_layout();
}

void TransformerRunner::execute_with_depth_weights(const BatchMeta& batch,
                                                   std::span<const int32_t> logit_rows,
                                                   std::vector<float>& logits,
                                                   std::span<const int32_t> depth_rows,
                                                   std::vector<float>& depth_weights) {
  const DepthWeightsRequest depth{depth_rows, &depth_weights};
  run(batch, logit_rows, logits, &depth);
}

}  // namespace attnres
