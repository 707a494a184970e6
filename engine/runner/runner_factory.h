// What runs a model, built from resolved RunnerArgs (runner_args.h): one backend and one
// Transformer behind a TransformerRunner, or a tensor-parallel group (tensor_parallel_size > 1:
// N GPUs over NCCL with device "cuda", N thread groups on the CPU; or one rank per process in a
// job started by mpirun), behind the same ModelRunner the engine loop drives.
//
// Backends and tensor-parallel groups come from the registries by the name in args.device
// (engine/core/backend_registry.h, engine/parallel/communicator_registry.h), so this file knows
// no backend; call register_builtin_backends() (kernels/builtin_backends.h) first. Error
// messages name the attnres flag a value comes from: they are what the command prints.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/core/backend.h"
#include "engine/model/loaded_model.h"
#include "engine/model/transformer.h"
#include "engine/parallel/process_group.h"
#include "engine/runner/model_runner.h"
#include "engine/runner/runner_args.h"

namespace attnres {

struct ModelExecution {
  std::unique_ptr<Backend> backend;          // single device only
  std::unique_ptr<Transformer> transformer;  // single device only
  std::unique_ptr<ModelRunner> runner;
  int tensor_parallel_size = 1;
  DType kv_cache_dtype = DType::F32;    // what the KV cache holds (RunnerArgs::kv_cache_dtype)
  DType depth_bank_dtype = DType::F32;  // what the depth bank holds
  bool bf16_linear_inputs = false;      // linears round their inputs to bf16
  size_t weight_bytes_per_rank = 0;     // what one rank's decode step reads
  // For logs: "cpu(2 threads)", "cpu x2 (in-process)", with ", bf16 linear inputs" when on.
  std::string description;
};

// The single-device backend args.device names (args.threads for the CPU, bf16 linear inputs
// as args says).
std::unique_ptr<Backend> make_backend(const RunnerArgs& args);

// Builds the backend(s), uploads or shards the weights and allocates `num_kv_blocks` blocks
// of KV cache (per rank). In a multi-process job (job_process_group(), started by mpirun) this
// is rank 0's side: the runner drives the other processes' shards (process_runner.h), and
// args.tensor_parallel_size must be the number of processes.
std::unique_ptr<ModelExecution> make_model_execution(const RunnerArgs& args,
                                                     const LoadedModel& model, int num_kv_blocks,
                                                     int block_size);

// The other ranks' side of make_model_execution in a multi-process job: obeys rank 0 (loads
// the shards it asks for with the RunnerArgs it sends, runs its steps) until it says Exit.
// Returns the process's exit status.
int run_process_rank(ProcessGroup& group);

// Whether this process is one rank of a multi-process job (job_process_group(): started by
// mpirun), for the layers above that must not reach into engine/parallel.
bool in_multi_process_job();

}  // namespace attnres
