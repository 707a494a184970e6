// What runs a model for a command, built from the shared model flags: one backend and one
// Transformer (the default), or a tensor-parallel group (--tensor-parallel-size N: N GPUs
// over NCCL with --device cuda, N thread groups on the CPU), behind the same ModelRunner
// the offline generator and the server's engine loop drive.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/core/backend.h"
#include "engine/model/loaded_model.h"
#include "engine/model/transformer.h"
#include "engine/sched/model_runner.h"
#include "clients/cli_flags/flags.h"

namespace attnres::cli {

struct ModelExecution {
  std::unique_ptr<Backend> backend;          // single device only
  std::unique_ptr<Transformer> transformer;  // single device only
  std::unique_ptr<ModelRunner> runner;
  int tensor_parallel_size = 1;
  size_t weight_bytes_per_rank = 0;  // what one rank's decode step reads
  std::string description;           // for logs: "cpu (2 threads)", "cpu x2 (in-process)"
};

// --tensor-parallel-size (>= 1, checked against the model's head counts).
int tensor_parallel_size_from_flags(const Flags& flags, const LoadedModel& model);

// KV cache blocks that fit in `budget_bytes` per rank (a rank caches only its KV heads).
int kv_blocks_for_budget(const Flags& flags, const LoadedModel& model, int block_size,
                         size_t budget_bytes);
// Bytes one block takes on one rank.
size_t kv_bytes_per_block(const Flags& flags, const LoadedModel& model, int block_size);

// Builds the backend(s), uploads or shards the weights and allocates `num_kv_blocks` blocks
// of KV cache (per rank).
std::unique_ptr<ModelExecution> make_model_execution(const Flags& flags, const LoadedModel& model,
                                                     int num_kv_blocks, int block_size);

}  // namespace attnres::cli
