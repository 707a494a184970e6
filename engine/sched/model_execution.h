// What runs a model for a command, built from EngineArgs (engine/sched/engine_args.h): one
// backend and one Transformer, or a tensor-parallel group (tensor_parallel_size > 1: N GPUs
// over NCCL with device "cuda", N thread groups on the CPU), behind the same ModelRunner the
// offline generator and the server's engine loop drive; and the EngineConfig of `attnres serve`.
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
#include "engine/sched/engine_args.h"
#include "engine/sched/engine_core.h"
#include "engine/sched/model_runner.h"

namespace attnres {

struct ModelExecution {
  std::unique_ptr<Backend> backend;          // single device only
  std::unique_ptr<Transformer> transformer;  // single device only
  std::unique_ptr<ModelRunner> runner;
  int tensor_parallel_size = 1;
  DType kv_cache_dtype = DType::F32;    // what the KV cache holds (kv_cache_dtype below)
  DType depth_bank_dtype = DType::F32;  // what the depth bank holds (depth_bank_dtype below)
  bool bf16_linear_inputs = false;      // linears round their inputs to bf16 (below)
  size_t weight_bytes_per_rank = 0;     // what one rank's decode step reads
  // For logs: "cpu(2 threads)", "cpu x2 (in-process)", with ", bf16 linear inputs" when on.
  std::string description;
};

// The model named by args.model (a directory, builtin:NAME, or the demo model when empty).
LoadedModel load_model(const EngineArgs& args);

// args.tensor_parallel_size, checked against the model's head counts (and
// sequence_parallel_min_tokens >= 0, an error with one rank too).
int tensor_parallel_size(const EngineArgs& args, const LoadedModel& model);

// The KV cache dtype of args.kv_cache_dtype: "float32" -> F32, "bfloat16" -> BF16, "auto" ->
// BF16 when the model's weights are bf16 and args.device's backend takes a bf16 cache
// (BackendCapabilities::kv_cache_dtypes), else F32. Throws for an explicit dtype the backend does
// not take, or an unknown name.
DType kv_cache_dtype(const EngineArgs& args, const LoadedModel& model);

// The depth bank dtype of args.depth_bank_dtype, resolved the same way against the backend's
// depth ops (BackendCapabilities::depth_bank_dtypes). A plain model has no bank; the
// setting then changes nothing.
DType depth_bank_dtype(const EngineArgs& args, const LoadedModel& model);

// Whether linears round their input rows to bf16 (BackendOptions::bf16_linear_inputs), from
// args.linear_input_dtype: "float32" -> no; "bfloat16" -> yes (the model's weights must be
// bf16 and args.device's backend must take it, BackendCapabilities::bf16_linear_inputs);
// "auto" -> yes for bf16 weights where the backend prefers it
// (BackendCapabilities::prefers_bf16_linear_inputs). Throws for an unknown name or a refusal.
bool bf16_linear_inputs(const EngineArgs& args, const LoadedModel& model);
// "bfloat16" or "float32": what bf16_linear_inputs resolves to, for logs and for the other
// ranks of a multi-process job.
std::string linear_input_dtype_name(const EngineArgs& args, const LoadedModel& model);

// Bytes one KV block takes on one rank (a rank caches only its KV heads), in
// kv_cache_dtype(args, model).
size_t kv_bytes_per_block(const EngineArgs& args, const LoadedModel& model, int block_size);
// KV cache blocks that fit in `budget_bytes` per rank.
int kv_blocks_for_budget(const EngineArgs& args, const LoadedModel& model, int block_size,
                         size_t budget_bytes);

// The single-device backend args.device names (threads for the CPU, bf16 linear inputs as
// bf16_linear_inputs(args, model) says).
std::unique_ptr<Backend> make_backend(const EngineArgs& args, const LoadedModel& model);

// Builds the backend(s), uploads or shards the weights and allocates `num_kv_blocks` blocks
// of KV cache (per rank). In a multi-process job (job_process_group(), started by mpirun) this
// is rank 0's side: the runner drives the other processes' shards (process_runner.h), and
// args.tensor_parallel_size must be the number of processes.
std::unique_ptr<ModelExecution> make_model_execution(const EngineArgs& args,
                                                     const LoadedModel& model, int num_kv_blocks,
                                                     int block_size);

// The other ranks' side of make_model_execution in a multi-process job: obeys rank 0 (loads
// the shards it asks for, runs its steps) until it says Exit. Returns the process's exit status.
int run_process_rank(ProcessGroup& group);

// The serving engine's configuration: the KV cache sized from kv_cache_memory_bytes,
// max_model_len resolved against the model and the cache, the scheduler limits validated, and
// the model's EOS ids, vocabulary and text decoder.
EngineConfig make_engine_config(const EngineArgs& args, const LoadedModel& model);

}  // namespace attnres
