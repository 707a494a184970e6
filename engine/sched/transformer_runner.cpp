#include "engine/sched/transformer_runner.h"

namespace attnres {
namespace {

bool uses_graphs(Backend& backend, const RunnerOptions& options) {
  return options.max_graph_batch > 0 && backend.supports_step_graphs();
}

int cache_blocks(Backend& backend, int num_blocks, int block_size, const RunnerOptions& options) {
  if (!uses_graphs(backend, options)) return num_blocks;
  return num_blocks + DecodeGraphs::padding_blocks(options.max_graph_batch, block_size);
}

}  // namespace

TransformerRunner::TransformerRunner(Transformer& model, int num_blocks, int block_size,
                                     const RunnerOptions& options)
    : model_(model),
      cache_(KvCache::allocate(model.backend(), model.config(),
                               cache_blocks(model.backend(), num_blocks, block_size, options),
                               block_size, options.kv_dtype)) {
  if (uses_graphs(model.backend(), options)) {
    graphs_ = std::make_unique<DecodeGraphs>(model, cache_, num_blocks, options.max_graph_batch);
  }
}

TransformerRunner::TransformerRunner(Transformer& model, int num_blocks, int block_size,
                                     DType kv_dtype)
    : TransformerRunner(model, num_blocks, block_size, RunnerOptions{kv_dtype}) {}

int TransformerRunner::vocab_size() const { return model_.config().vocab_size; }

void TransformerRunner::execute(const StepBatch& batch, StepResult& result) {
  result.sampled_ids.clear();  // sampled on the host
  result.depth_weights.clear();
  Tensor device_logits;
  if (graphs_ && graphs_->takes(batch)) {
    device_logits = model_.lm_head(graphs_->run(batch));
  } else {
    const DepthWeightsRequest depth{batch.depth_rows, &result.depth_weights};
    device_logits = model_.forward(batch.meta, cache_, batch.logit_rows,
                                   batch.wants_depth_weights() ? &depth : nullptr);
  }
  result.logits.resize(static_cast<size_t>(device_logits.numel()));
  // A step with only non-final prefill chunks asks for no logits.
  if (!result.logits.empty()) model_.backend().download(device_logits, result.logits.data());
}

DepthAttentionLayout TransformerRunner::depth_attention_layout() const {
  return model_.depth_attention_layout();
}

}  // namespace attnres
