#include "engine/runner/transformer_runner.h"

#include <string>

#include "engine/core/error.h"

namespace attnres {
namespace {

bool uses_graphs(Backend& backend, const RunnerOptions& options) {
  return options.max_graph_batch > 0 && backend.capabilities().step_graphs;
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
  launch(batch, result);
  if (sampling_pending_) launch_sampling(batch, result);
  collect(result);
}

bool TransformerRunner::launches_asynchronously() const {
  return model_.backend().capabilities().samples_asynchronously;
}

void TransformerRunner::collect(StepResult& result) {
  (void)result;  // launch() gave the backend result.sampled_ids to fill
  ATTNRES_CHECK(in_flight_, "TransformerRunner::collect without a launched step");
  ATTNRES_CHECK(!sampling_pending_, "TransformerRunner::collect before launch_sampling");
  in_flight_ = false;
  Tensor logits = std::move(in_flight_logits_);
  in_flight_logits_ = Tensor();
  model_.backend().wait_sampled();
}

void TransformerRunner::launch(const StepBatch& batch, StepResult& result) {
  ATTNRES_CHECK(!in_flight_, "TransformerRunner::launch while a step is in flight");
  result.depth_weights.clear();
  const DepthWeightsRequest depth{batch.depth_rows, &result.depth_weights};
  // One LM head over both kinds of rows: the sampled ones first, so they are rows [0, S) of the
  // logits Backend::sample reads, then the ones that come back.
  head_rows_.assign(batch.sample_rows.begin(), batch.sample_rows.end());
  head_rows_.insert(head_rows_.end(), batch.logit_rows.begin(), batch.logit_rows.end());
  Tensor device_logits;
  if (graphs_ && graphs_->takes(batch.meta, head_rows_, batch.wants_depth_weights())) {
    device_logits = model_.lm_head(graphs_->run(batch.meta));
  } else {
    device_logits = model_.forward(batch.meta, cache_, head_rows_,
                                   batch.wants_depth_weights() ? &depth : nullptr);
  }
  const int64_t sampled = static_cast<int64_t>(batch.sample_rows.size());
  ATTNRES_CHECK(static_cast<int64_t>(batch.sampling.rows.size()) == sampled,
                "a step with " + std::to_string(sampled) + " rows to sample and " +
                    std::to_string(batch.sampling.rows.size()) + " rows of sampling parameters");
  result.sampled_ids.resize(static_cast<size_t>(sampled));
  in_flight_logits_ = std::move(device_logits);
  in_flight_ = true;
  // Masked rows wait for their masks, which the engine computes while this forward runs (and
  // so does the host rows' download, which would wait for the forward).
  sampling_pending_ = has_masked_rows(batch);
  if (!sampling_pending_) download_and_sample(batch, result);
}

void TransformerRunner::launch_sampling(const StepBatch& batch, StepResult& result) {
  ATTNRES_CHECK(in_flight_ && sampling_pending_,
                "TransformerRunner::launch_sampling without a launched step that waits for it");
  sampling_pending_ = false;
  download_and_sample(batch, result);
}

void TransformerRunner::download_and_sample(const StepBatch& batch, StepResult& result) {
  const int64_t sampled = static_cast<int64_t>(batch.sample_rows.size());
  // The host rows are rows [S, S + L): sample() only reads (and overwrites) rows [0, S).
  const Tensor host_rows = in_flight_logits_.rows(sampled, in_flight_logits_.dim(0));
  result.logits.resize(static_cast<size_t>(host_rows.numel()));
  // A step with only non-final prefill chunks asks for no logits.
  if (!result.logits.empty()) model_.backend().download(host_rows, result.logits.data());
  if (sampled > 0) {
    model_.backend().sample_async(in_flight_logits_, batch.sampling, result.sampled_ids);
  }
}

DepthAttentionLayout TransformerRunner::depth_attention_layout() const {
  return model_.depth_attention_layout();
}

}  // namespace attnres
