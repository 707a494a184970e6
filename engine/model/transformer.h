// The decoder forward, written once against the Backend interface and driven by the
// DepthPlan: embed -> for each sublayer: depth mix fused with PreNorm (two-phase,
// ATTNRES.md §3) -> attention or SwiGLU MLP -> add into the partial / grow the bank ->
// final mix (2b) -> norm -> LM head. The same code runs plain Qwen3 / Qwen2 / Llama models
// (the plan then has no mixes) and every AttnRes variant.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "engine/core/backend.h"
#include "engine/model/depth_plan.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace attnres {

class Transformer {
 public:
  // Uploads the weights to the backend (the CPU backend keeps them where they are: a
  // memory-mapped bf16 weight stays a memory-mapped bf16 weight) and folds each depth
  // RMSNorm gain into its pseudo-query.
  Transformer(const ModelConfig& config, const ModelWeights& weights, Backend& backend);

  // One step over the tokens of `batch` (prefill chunks and decode tokens alike). Writes
  // their K/V into `cache` and returns the logits [logit_rows.size(), vocab] (f32, on the
  // backend's device) of the requested rows of the step.
  Tensor forward(const BatchMeta& batch, KvCache& cache, std::span<const int32_t> logit_rows);

  const DepthPlan& plan() const { return plan_; }
  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }
  // Bytes of weights one decode step reads (the roofline numerator before the KV cache).
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  struct Scratch;
  void attention_sublayer(int layer, const Tensor& normed, const BatchMeta& batch,
                          KvCacheLayer& cache, Scratch& scratch, Tensor& out);
  void mlp_sublayer(int layer, const Tensor& normed, Scratch& scratch, Tensor& out);
  Tensor upload(const Tensor& t);

  ModelConfig config_;
  Backend& backend_;
  DepthPlan plan_;
  ModelWeights weights_;               // device tensors
  std::vector<Tensor> group_queries_;  // per Phase-1 group: [steps, d] f32, gain folded in
  std::vector<float> step_bias_;       // per plan step: the bias on the partial's logit
  Tensor inv_freq_;                    // [head_dim / 2] f32
  size_t weight_bytes_ = 0;
};

}  // namespace attnres
