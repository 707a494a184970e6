// The ModelRunner for a model split across the P ranks of a tensor-parallel group whose ranks
// are threads of this process (engine/runner/tensor_parallel.h says how it is split). Each
// rank is a ShardRank (shard_rank.h: backend, communicator, weight slices, KV cache, the step)
// on its own thread. The engine thread calls execute(); every rank runs the same step; rank 0
// returns the full-vocabulary logits. (One rank per process: process_runner.h.)
//
// Every rank builds its backend, weights and cache on its own thread (a CUDA rank's device
// is current on that thread). A rank that throws aborts the group, so no rank waits forever
// in a collective; the error reaches the engine thread from execute().
#pragma once

#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/backend.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/model/transformer.h"
#include "engine/parallel/communicator.h"
#include "engine/runner/model_runner.h"
#include "engine/runner/shard_rank.h"

namespace attnres {

struct TensorParallelOptions {
  int size = 1;  // P: ranks
  // A rank's backend (called on the rank's thread): e.g. a CPU backend with 1/P of the
  // threads, or the CUDA backend of device `rank`.
  std::function<std::unique_ptr<Backend>(int rank)> make_backend;
  // A rank's communicator (called on the rank's thread, after its backend exists).
  std::function<std::unique_ptr<Communicator>(int rank, Backend& backend)> make_communicator;
  int num_kv_blocks = 0;  // per rank; the engine's BlockManager uses the same number
  int block_size = 16;
  DType kv_cache_dtype = DType::F32;    // F32, or BF16 where the backend takes it
  DType depth_bank_dtype = DType::F32;  // likewise (BackendCapabilities::depth_bank_dtypes)
  // Prefill steps with at least this many prefill tokens run sequence-parallel (0: never).
  int sequence_parallel_min_tokens = 128;
};

class TensorParallelRunner : public ModelRunner {
 public:
  // `weights` are the full model's (host tensors, usually memory-mapped): each rank takes its
  // slices from them (shard_weights), so they must outlive construction only.
  TensorParallelRunner(const ModelConfig& config, const ModelWeights& weights,
                       TensorParallelOptions options);
  ~TensorParallelRunner() override;
  TensorParallelRunner(const TensorParallelRunner&) = delete;
  TensorParallelRunner& operator=(const TensorParallelRunner&) = delete;

  int vocab_size() const override { return config_.vocab_size; }
  // Depth weights (batch.depth_rows): every rank computes the weights of its rows (the depth
  // mix is per token); rank 0's copy, gathered over the sequence-parallel slices, is the result.
  void execute(const StepBatch& batch, StepResult& result) override;
  DepthAttentionLayout depth_attention_layout() const override;

  int size() const { return options_.size; }
  // Rank r's model (after a step: its ForwardFootprint; its weight_bytes()).
  const Transformer& rank_model(int rank) const;
  std::string backend_name() const;

 private:
  void rank_main(int rank, const ModelWeights* full_weights);
  // One step for execute() (no depth rows: none computed).
  void run(const BatchMeta& batch, std::span<const int32_t> logit_rows, std::vector<float>& logits,
           std::span<const int32_t> depth_rows, std::vector<float>* depth_weights);
  void stop_threads();

  const ModelConfig config_;
  const TensorParallelOptions options_;
  std::vector<std::unique_ptr<ShardRank>> ranks_;  // each built and used on its own thread

  // The step being run (the engine thread writes it before bumping step_generation_).
  const BatchMeta* batch_ = nullptr;
  std::span<const int32_t> logit_rows_;
  std::vector<float>* logits_ = nullptr;
  std::span<const int32_t> depth_rows_;          // empty: no depth weights this step
  std::vector<float>* depth_weights_ = nullptr;  // rank 0 fills it

  std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t step_generation_ = 0;  // bumped for each step; 0 until the first
  int ready_ = 0;                 // ranks that finished construction
  int done_ = 0;                  // ranks that finished the current step
  bool stopping_ = false;
  std::string error_;  // the first failure of construction or of the current step
  std::vector<std::thread> threads_;
};

}  // namespace attnres
