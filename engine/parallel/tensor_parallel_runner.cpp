#include "engine/parallel/tensor_parallel_runner.h"

#include <cstring>

#include "engine/core/error.h"
#include "engine/parallel/tensor_parallel.h"

namespace attnres {

struct TensorParallelRunner::Rank {
  int index = 0;
  const ModelWeights* full_weights = nullptr;  // during construction only
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Transformer> model;
  KvCache cache;
  std::vector<float> gathered_host;  // rank 0: the all-gathered logit slices
};

TensorParallelRunner::TensorParallelRunner(const ModelConfig& config, const ModelWeights& weights,
                                           TensorParallelOptions options)
    : config_(config), options_(std::move(options)) {
  check_tensor_parallel(config_, options_.size);
  if (!options_.make_backend || !options_.make_communicator) {
    throw Error("tensor parallelism needs a backend and a communicator factory");
  }
  if (options_.num_kv_blocks < 1) throw Error("tensor parallelism: no KV cache blocks");
  for (int r = 0; r < options_.size; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->index = r;
    rank->full_weights = &weights;
    ranks_.push_back(std::move(rank));
  }
  for (int r = 0; r < options_.size; ++r) threads_.emplace_back([this, r] { rank_main(r); });
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
  return *ranks_[rank]->model;
}

std::string TensorParallelRunner::backend_name() const {
  return ranks_[0]->backend->name() + " x" + std::to_string(size()) + " (" +
         ranks_[0]->comm->name() + ")";
}

void TensorParallelRunner::rank_main(int index) {
  Rank& r = *ranks_[index];
  // Construction, on this rank's thread.
  try {
    const TensorParallelShard shard = shard_of(config_, index, options_.size);
    r.backend = options_.make_backend(index);
    r.comm = options_.make_communicator(index, *r.backend);
    ATTNRES_CHECK(r.comm && r.comm->size() == options_.size && r.comm->rank() == index,
                  "communicator of the wrong shape");
    const ModelConfig local = local_config(config_, shard);
    ParallelRole role;
    role.comm = r.comm.get();
    role.sequence_parallel_min_tokens = options_.sequence_parallel_min_tokens;
    r.model = std::make_unique<Transformer>(local, shard_weights(*r.full_weights, config_, shard),
                                            *r.backend, role);
    r.cache = KvCache::allocate(*r.backend, local, options_.num_kv_blocks, options_.block_size);
  } catch (const std::exception& e) {
    std::lock_guard lock(mutex_);
    if (error_.empty()) error_ = "rank " + std::to_string(index) + ": " + e.what();
  }
  r.full_weights = nullptr;
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
    try {
      run_step(r);
    } catch (const std::exception& e) {
      // Wake the ranks waiting for this one in a collective; keep the first cause.
      if (r.comm) r.comm->abort("rank " + std::to_string(index) + " failed: " + e.what());
      std::lock_guard lock(mutex_);
      if (error_.empty()) error_ = "rank " + std::to_string(index) + ": " + e.what();
    }
    {
      std::lock_guard lock(mutex_);
      ++done_;
    }
    changed_.notify_all();
  }
  // Device memory is released on the thread (and so the device) that allocated it.
  r.cache = KvCache{};
  r.model.reset();
  r.comm.reset();
  r.backend.reset();
}

void TensorParallelRunner::run_step(Rank& r) {
  const int64_t rows = static_cast<int64_t>(logit_rows_.size());
  // Every rank computes the weights (under sequence parallelism each holds a slice of the
  // rows, gathered in a collective); only rank 0 copies them to the host.
  const DepthWeightsRequest depth{depth_rows_, r.index == 0 ? depth_weights_ : nullptr};
  Tensor local =
      r.model->forward(*batch_, r.cache, logit_rows_, depth_rows_.empty() ? nullptr : &depth);
  if (rows == 0) return;
  // The vocabulary-parallel LM head: every rank holds [rows, slice] logits of its slice.
  const int P = options_.size;
  const int64_t slice = local.dim(1);
  Tensor gathered = r.backend->alloc({P * rows, slice}, DType::F32);
  r.comm->all_gather(local, gathered);
  if (r.index != 0) return;
  r.gathered_host.resize(static_cast<size_t>(gathered.numel()));
  r.backend->download(gathered, r.gathered_host.data());
  // gathered is [P][rows][slice]; logits row i is rank 0's slice, rank 1's, ... with the
  // padding of the last slices dropped.
  const int64_t vocab = config_.vocab_size;
  std::vector<float>& out = *logits_;
  out.resize(static_cast<size_t>(rows * vocab));
  for (int q = 0; q < P; ++q) {
    const int64_t begin = std::min<int64_t>(vocab, q * slice);
    const int64_t count = std::min<int64_t>(vocab, (q + 1) * slice) - begin;
    if (count <= 0) continue;
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(out.data() + i * vocab + begin, r.gathered_host.data() + (q * rows + i) * slice,
                  static_cast<size_t>(count) * sizeof(float));
    }
  }
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
  return ranks_[0]->model->depth_attention_layout();
}

}  // namespace attnres
