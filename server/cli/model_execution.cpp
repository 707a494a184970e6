#include "server/cli/model_execution.h"

#include <omp.h>

#include <algorithm>

#include "engine/core/error.h"
#include "engine/model/kv_cache.h"
#include "engine/parallel/in_process_communicator.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/parallel/tensor_parallel_runner.h"
#include "engine/sched/transformer_runner.h"
#include "kernels/cpu/cpu_backend.h"
#include "server/cli/commands.h"
#ifdef ATTNRES_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif
#ifdef ATTNRES_HAVE_NCCL
#include "engine/parallel/nccl_communicator.h"
#endif

namespace attnres::cli {
namespace {

int sequence_parallel_min_tokens(const Flags& flags) {
  const int tokens = flags.get_int("sequence-parallel-min-tokens", 128);
  if (tokens < 0) throw Error("--sequence-parallel-min-tokens: must be >= 0");
  return tokens;
}

// The config one rank computes with (its KV heads decide its cache size).
ModelConfig rank_config(const Flags& flags, const LoadedModel& model) {
  const int size = tensor_parallel_size_from_flags(flags, model);
  return local_config(model.config, shard_of(model.config, 0, size));
}

TensorParallelOptions parallel_options(const Flags& flags, int size, int num_kv_blocks,
                                       int block_size) {
  TensorParallelOptions options;
  options.size = size;
  options.num_kv_blocks = num_kv_blocks;
  options.block_size = block_size;
  options.sequence_parallel_min_tokens = sequence_parallel_min_tokens(flags);
  const std::string device = flags.get("device", "cpu");
  if (device == "cpu") {
    const int threads = flags.get_int("threads", 0);
    const int total = threads > 0 ? threads : omp_get_max_threads();
    const int per_rank = std::max(1, total / size);
    const bool batch_invariant = !flags.has("fast-prefill");
    options.make_backend = [per_rank, batch_invariant](int) {
      return make_cpu_backend(per_rank, batch_invariant);
    };
    auto group = InProcessGroup::create(size);
    options.make_communicator = [group](int rank, Backend&) { return group->communicator(rank); };
    return options;
  }
  if (device == "cuda") {
#if defined(ATTNRES_HAVE_CUDA) && defined(ATTNRES_HAVE_NCCL)
    std::vector<int> devices(size);
    for (int r = 0; r < size; ++r) devices[r] = r;
    options.make_backend = [](int rank) { return make_cuda_backend(rank); };
    auto group = NcclGroup::create(devices);
    options.make_communicator = [group](int rank, Backend& backend) {
      return group->communicator(rank, backend);
    };
    return options;
#else
    throw Error("--tensor-parallel-size with --device cuda needs a build with CUDA and NCCL");
#endif
  }
  throw Error("--device: unknown device '" + device + "' (expected cpu or cuda)");
}

}  // namespace

int tensor_parallel_size_from_flags(const Flags& flags, const LoadedModel& model) {
  const int size = flags.get_int("tensor-parallel-size", 1);
  check_tensor_parallel(model.config, size);
  sequence_parallel_min_tokens(flags);  // a bad value is an error with one rank too
  return size;
}

size_t kv_bytes_per_block(const Flags& flags, const LoadedModel& model, int block_size) {
  return KvCache::bytes_per_block(rank_config(flags, model), block_size);
}

int kv_blocks_for_budget(const Flags& flags, const LoadedModel& model, int block_size,
                         size_t budget_bytes) {
  return KvCache::blocks_for_budget(rank_config(flags, model), block_size, budget_bytes);
}

std::unique_ptr<ModelExecution> make_model_execution(const Flags& flags, const LoadedModel& model,
                                                     int num_kv_blocks, int block_size) {
  auto exec = std::make_unique<ModelExecution>();
  exec->tensor_parallel_size = tensor_parallel_size_from_flags(flags, model);
  if (exec->tensor_parallel_size == 1) {
    exec->backend = make_backend_from_flags(flags);
    exec->transformer = std::make_unique<Transformer>(model.config, model.weights, *exec->backend);
    exec->runner =
        std::make_unique<TransformerRunner>(*exec->transformer, num_kv_blocks, block_size);
    exec->weight_bytes_per_rank = exec->transformer->weight_bytes();
    exec->description = exec->backend->name();
    return exec;
  }
  auto runner = std::make_unique<TensorParallelRunner>(
      model.config, model.weights,
      parallel_options(flags, exec->tensor_parallel_size, num_kv_blocks, block_size));
  exec->weight_bytes_per_rank = runner->rank_model(0).weight_bytes();
  exec->description = runner->backend_name();
  exec->runner = std::move(runner);
  return exec;
}

}  // namespace attnres::cli
