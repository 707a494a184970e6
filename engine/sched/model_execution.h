// EngineArgs (engine/sched/engine_args.h) -> what runs a model and the serving engine around it.
// The "auto" settings (--kv-cache-dtype, --depth-bank-dtype, --linear-input-dtype) are decided
// here, against the model and the backend args.device names, into the RunnerArgs
// (engine/runner/runner_args.h) the runners are built from (engine/runner/runner_factory.h);
// nothing below reads a flag spelling. Error messages name the attnres flag a value comes from:
// they are what the command prints.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/core/backend.h"
#include "engine/model/loaded_model.h"
#include "engine/runner/runner_args.h"
#include "engine/runner/runner_factory.h"
#include "engine/sched/engine_args.h"
#include "engine/sched/engine_core.h"

namespace attnres {

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
// "bfloat16" or "float32": what bf16_linear_inputs resolves to, for logs.
std::string linear_input_dtype_name(const EngineArgs& args, const LoadedModel& model);

// Every runner setting of args, checked and resolved once (the functions above, and
// --enforce-eager / --max-num-seqs into the step-graph batch limit).
RunnerArgs resolve_runner_args(const EngineArgs& args, const LoadedModel& model);

// Bytes one KV block takes on one rank (a rank caches only its KV heads), in
// kv_cache_dtype(args, model).
size_t kv_bytes_per_block(const EngineArgs& args, const LoadedModel& model, int block_size);
// KV cache blocks that fit in `budget_bytes` per rank.
int kv_blocks_for_budget(const EngineArgs& args, const LoadedModel& model, int block_size,
                         size_t budget_bytes);

// The single-device backend args.device names (threads for the CPU, bf16 linear inputs as
// bf16_linear_inputs(args, model) says).
std::unique_ptr<Backend> make_backend(const EngineArgs& args, const LoadedModel& model);

// make_model_execution (engine/runner/runner_factory.h) of resolve_runner_args(args, model).
std::unique_ptr<ModelExecution> make_model_execution(const EngineArgs& args,
                                                     const LoadedModel& model, int num_kv_blocks,
                                                     int block_size);

// The serving engine's configuration: the KV cache sized from kv_cache_memory_bytes,
// max_model_len resolved against the model and the cache, the scheduler limits validated, and
// the model's EOS ids, vocabulary and text decoder.
EngineConfig make_engine_config(const EngineArgs& args, const LoadedModel& model);

}  // namespace attnres
