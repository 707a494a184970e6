// The ModelRunner the server plugs into EngineCore: the real Transformer forward over a paged
// KvCache it owns. It samples batch.sample_rows on the model's backend (Backend::sample) and
// copies back to the host only the logits of batch.logit_rows. On a backend that records step
// graphs, decode steps replay graphs (decode_graphs.h) unless told not to.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/transformer.h"
#include "engine/runner/decode_graphs.h"
#include "engine/runner/model_runner.h"

namespace attnres {

struct RunnerOptions {
  DType kv_dtype = DType::F32;  // F32, or BF16 where the backend takes it (KvCache::allocate)
  // Decode steps of up to this many sequences run as step graphs where the backend records
  // them (BackendCapabilities::step_graphs); 0: every step eagerly (--enforce-eager).
  int max_graph_batch = 256;
};

class TransformerRunner : public ModelRunner {
 public:
  // Allocates num_blocks blocks of block_size tokens on the model's backend (and, with
  // decode graphs, a few padding blocks past them that the engine never sees); give the
  // engine the same numbers (EngineConfig::num_kv_blocks / block_size).
  TransformerRunner(Transformer& model, int num_blocks, int block_size,
                    const RunnerOptions& options);
  TransformerRunner(Transformer& model, int num_blocks, int block_size,
                    DType kv_dtype = DType::F32);

  int vocab_size() const override;
  void execute(const StepBatch& batch, StepResult& result) override;
  // execute() in two halves: launch() queues the forward and the sample op and returns (the
  // host logits, when the step has any, are downloaded inside it: that copy waits); collect()
  // waits for the sampled ids. Asynchronous where the backend samples asynchronously (CUDA).
  void launch(const StepBatch& batch, StepResult& result) override;
  void collect(StepResult& result) override;
  bool launches_asynchronously() const override;
  DepthAttentionLayout depth_attention_layout() const override;
  bool samples_on_device() const override { return true; }
  // A batch with masked rows: launch() queues the forward only, launch_sampling() the sample
  // op over the logits it kept.
  bool samples_masked_rows() const override { return true; }
  void launch_sampling(const StepBatch& batch, StepResult& result) override;

  const KvCache& cache() const { return cache_; }
  // Null when decode steps run eagerly.
  const DecodeGraphs* decode_graphs() const { return graphs_.get(); }

 private:
  Transformer& model_;
  KvCache cache_;
  std::unique_ptr<DecodeGraphs> graphs_;
  std::vector<int32_t> head_rows_;  // the LM head's rows: sample_rows, then logit_rows
  // The launched step's logits, which the queued sample op reads: held until collect().
  Tensor in_flight_logits_;
  bool in_flight_ = false;
  bool sampling_pending_ = false;  // launched with masked rows; launch_sampling() not yet called
  // The launch's second half: the host rows' logits come back, the sample op is queued.
  void download_and_sample(const StepBatch& batch, StepResult& result);
};

}  // namespace attnres
