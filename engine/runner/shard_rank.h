// One rank's share of a tensor-parallel model (tensor_parallel.h says how it is split): its
// backend, communicator, Transformer over its weight slices and paged KV cache (its own KV
// heads: the engine's block ids mean the same blocks on every rank), and the step every rank
// runs: the forward, then the vocabulary-parallel LM head's slices all-gathered, and on rank 0
// the full-vocabulary logit rows unpacked on the host, where the sampler and logprobs see what a
// single device would produce (up to the summation order of the all-reduces).
//
// The in-process runner (tensor_parallel_runner.h) runs P of them on threads of one process;
// each process of a multi-process job (process_runner.h) runs one.
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/core/backend.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/model/transformer.h"
#include "engine/parallel/communicator.h"

namespace attnres {

struct ShardRankOptions {
  int rank = 0;
  int size = 1;
  int num_kv_blocks = 0;
  int block_size = 16;
  DType kv_cache_dtype = DType::F32;       // F32, or BF16 where the backend takes it
  DType depth_bank_dtype = DType::F32;     // likewise (BackendCapabilities::depth_bank_dtypes)
  int sequence_parallel_min_tokens = 128;  // prefill steps with this many tokens run SP (0: never)
};

class ShardRank {
 public:
  using CommunicatorFactory = std::function<std::unique_ptr<Communicator>(Backend&)>;
  // Builds on the calling thread (a CUDA rank's device must be current on it); `full` must
  // outlive construction only (the rank keeps views of, or copies from, its slices).
  ShardRank(const ModelConfig& config, const ModelWeights& full, const ShardRankOptions& options,
            std::unique_ptr<Backend> backend, const CommunicatorFactory& make_communicator);
  // Releases the cache, the model, the communicator, then the backend (on the building thread).
  ~ShardRank();
  ShardRank(const ShardRank&) = delete;
  ShardRank& operator=(const ShardRank&) = delete;

  // One step. Every rank of the group calls it with the same batch; rank 0 passes `logits`
  // (filled with logit_rows.size() full-vocabulary rows) and, when depth_rows is not empty,
  // `depth_weights`; the others pass null (they compute and communicate, but copy nothing out).
  void step(const BatchMeta& batch, std::span<const int32_t> logit_rows,
            std::span<const int32_t> depth_rows, std::vector<float>* logits,
            std::vector<float>* depth_weights);

  int rank() const { return options_.rank; }
  Backend& backend() { return *backend_; }
  Communicator& communicator() { return *comm_; }
  const Transformer& model() const { return *model_; }

 private:
  const int vocab_size_;  // the full model's
  const ShardRankOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Transformer> model_;
  KvCache cache_;
  std::vector<float> gathered_host_;  // rank 0: the all-gathered logit slices
};

}  // namespace attnres
