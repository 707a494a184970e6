#include "engine/runner/tensor_parallel_runner.h"

#include <cstring>

#include "engine/core/error.h"
#include "engine/runner/tensor_parallel.h"

namespace attnres {

TensorParallelRunner::TensorParallelRunner(const ModelConfig& config, const ModelWeights& weights,
                                           TensorParallelOptions options)
    : config_(config), options_(std::move(options)) {
  check_tensor_parallel(config_, options_.size);
  if (!options_.make_backend || !options_.make_communicator) {
    throw Error("tensor parallelism needs a backend and a communicator factory");
  }
  if (options_.num_kv_blocks < 1) throw Error("tensor parallelism: no KV cache blocks");
  ranks_.resize(options_.size);
  for (int r = 0; r < options_.size; ++r) {
    threads_.emplace_back([this, r, &weights] { rank_main(r, &weights); });
  }
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return ready_ == options_.size; });
  if (!error_.empty()) {
    const std::string why = error_;
    lock.unlock();
    stop_threads();
    throw Error("tensor parallelism: " + why);
  }
}

TensorParallelRunner::~TensorParallelRunner() { stop_threads(); }

void TensorParallelRunner::stop_threads() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

const Transformer& TensorParallelRunner::rank_model(int rank) const {
  ATTNRES_CHECK(rank >= 0 && rank < size(), "rank out of range");
  return ranks_[rank]->model();
}

std::string TensorParallelRunner::backend_name() const {
  return ranks_[0]->backend().name() + " x" + std::to_string(size()) + " (" +
         ranks_[0]->communicator().name() + ")";
}

void TensorParallelRunner::rank_main(int index, const ModelWeights* full_weights) {
  // Construction, on this rank's thread.
  try {
    ShardRankOptions shard;
    shard.rank = index;
    shard.size = options_.size;
    shard.num_kv_blocks = options_.num_kv_blocks;
    shard.block_size = options_.block_size;
    shard.kv_cache_dtype = options_.kv_cache_dtype;
    shard.depth_bank_dtype = options_.depth_bank_dtype;
    shard.sequence_parallel_min_tokens = options_.sequence_parallel_min_tokens;
    ranks_[index] = std::make_unique<ShardRank>(
        config_, *full_weights, shard, options_.make_backend(index),
        [&](Backend& backend) { return options_.make_communicator(index, backend); });
  } catch (const std::exception& e) {
    std::lock_guard lock(mutex_);
    if (error_.empty()) error_ = "rank " + std::to_string(index) + ": " + e.what();
  }
  uint64_t seen = 0;
  {
    std::lock_guard lock(mutex_);
    ++ready_;
  }
  changed_.notify_all();

  for (;;) {
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [&] { return stopping_ || step_generation_ != seen; });
      if (stopping_) break;
      seen = step_generation_;
    }
    ShardRank& r = *ranks_[index];
    try {
      const bool root = index == 0;
      r.step(*batch_, logit_rows_, depth_rows_, root ? logits_ : nullptr,
             root ? depth_weights_ : nullptr);
    } catch (const std::exception& e) {
      // Wake the ranks waiting for this one in a collective; keep the first cause.
      r.communicator().abort("rank " + std::to_string(index) + " failed: " + e.what());
      std::lock_guard lock(mutex_);
      if (error_.empty()) error_ = "rank " + std::to_string(index) + ": " + e.what();
    }
    {
      std::lock_guard lock(mutex_);
      ++done_;
    }
    changed_.notify_all();
  }
  // Released on this thread (a CUDA rank's device memory on its own device).
  ranks_[index].reset();
}

void TensorParallelRunner::execute(const StepBatch& batch, StepResult& result) {
  result.sampled_ids.clear();  // sampled on the host
  result.depth_weights.clear();
  run(batch.meta, batch.logit_rows, result.logits, batch.depth_rows,
      batch.wants_depth_weights() ? &result.depth_weights : nullptr);
}

void TensorParallelRunner::run(const BatchMeta& batch, std::span<const int32_t> logit_rows,
                               std::vector<float>& logits, std::span<const int32_t> depth_rows,
                               std::vector<float>* depth_weights) {
  std::unique_lock lock(mutex_);
  if (!error_.empty()) throw Error("tensor parallelism: " + error_);
  batch_ = &batch;
  logit_rows_ = logit_rows;
  logits_ = &logits;
  depth_rows_ = depth_rows;
  depth_weights_ = depth_weights;
  if (logit_rows.empty()) logits.clear();
  done_ = 0;
  ++step_generation_;
  changed_.notify_all();
  changed_.wait(lock, [&] { return done_ == options_.size; });
  batch_ = nullptr;
  logits_ = nullptr;
  depth_rows_ = {};
  depth_weights_ = nullptr;
  if (!error_.empty()) throw Error("tensor parallelism: " + error_);
}

DepthAttentionLayout TensorParallelRunner::depth_attention_layout() const {
  return ranks_[0]->model().depth_attention_layout();
}

}  // namespace attnres
