#include "engine/runner/shard_rank.h"

#include <algorithm>
#include <cstring>

#include "engine/core/error.h"
#include "engine/runner/tensor_parallel.h"

namespace attnres {

ShardRank::ShardRank(const ModelConfig& config, const ModelWeights& full,
                     const ShardRankOptions& options, std::unique_ptr<Backend> backend,
                     const CommunicatorFactory& make_communicator)
    : vocab_size_(config.vocab_size), options_(options), backend_(std::move(backend)) {
  const TensorParallelShard shard = shard_of(config, options_.rank, options_.size);
  comm_ = make_communicator(*backend_);
  ATTNRES_CHECK(comm_ && comm_->size() == options_.size && comm_->rank() == options_.rank,
                "communicator of the wrong shape");
  const ModelConfig local = local_config(config, shard);
  ParallelRole role;
  role.comm = comm_.get();
  role.sequence_parallel_min_tokens = options_.sequence_parallel_min_tokens;
  model_ = std::make_unique<Transformer>(local, shard_weights(full, config, shard), *backend_, role,
                                         options_.depth_bank_dtype);
  cache_ = KvCache::allocate(*backend_, local, options_.num_kv_blocks, options_.block_size,
                             options_.kv_cache_dtype);
}

ShardRank::~ShardRank() {
  // Device memory is released on the thread (and so the device) that allocated it.
  cache_ = KvCache{};
  model_.reset();
  comm_.reset();
  backend_.reset();
}

void ShardRank::step(const BatchMeta& batch, std::span<const int32_t> logit_rows,
                     std::span<const int32_t> depth_rows, std::vector<float>* logits,
                     std::vector<float>* depth_weights) {
  const int64_t rows = static_cast<int64_t>(logit_rows.size());
  // Every rank computes the depth weights (under sequence parallelism each holds a slice of the
  // rows, gathered in a collective); only the one that passed `depth_weights` copies them out.
  const DepthWeightsRequest depth{depth_rows, depth_weights};
  Tensor local = model_->forward(batch, cache_, logit_rows, depth_rows.empty() ? nullptr : &depth);
  if (logits) logits->clear();
  if (rows == 0) return;
  // The vocabulary-parallel LM head: every rank holds [rows, slice] logits of its slice.
  const int P = options_.size;
  const int64_t slice = local.dim(1);
  Tensor gathered = backend_->alloc({P * rows, slice}, DType::F32);
  comm_->all_gather(local, gathered);
  if (!logits) return;
  gathered_host_.resize(static_cast<size_t>(gathered.numel()));
  backend_->download(gathered, gathered_host_.data());
  // gathered is [P][rows][slice]; logits row i is rank 0's slice, rank 1's, ... with the
  // padding of the last slices dropped.
  const int64_t vocab = vocab_size_;
  logits->resize(static_cast<size_t>(rows * vocab));
  for (int q = 0; q < P; ++q) {
    const int64_t begin = std::min<int64_t>(vocab, q * slice);
    const int64_t count = std::min<int64_t>(vocab, (q + 1) * slice) - begin;
    if (count <= 0) continue;
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(logits->data() + i * vocab + begin,
                  gathered_host_.data() + (q * rows + i) * slice,
                  static_cast<size_t>(count) * sizeof(float));
    }
  }
}

}  // namespace attnres
