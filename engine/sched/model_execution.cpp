#include "engine/sched/model_execution.h"

#include <algorithm>

#include "engine/core/backend_registry.h"
#include "engine/core/error.h"
#include "engine/model/kv_cache.h"
#include "engine/parallel/communicator_registry.h"
#include "engine/parallel/process_runner.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/parallel/tensor_parallel_runner.h"
#include "engine/sched/tokenizer_constraints.h"
#include "engine/sched/tokenizer_text_decoder.h"
#include "engine/sched/transformer_runner.h"

namespace attnres {
namespace {

// The errors of a --device the registries do not have; "cuda" is known by name because a build
// without nvcc (or NCCL) says so rather than calling it unknown.
[[noreturn]] void throw_unknown_device(const std::string& device) {
  if (registered_backends().empty()) {
    throw Error(
        "no backends are registered: call register_builtin_backends() "
        "(kernels/builtin_backends.h) before building an engine");
  }
  throw Error("--device: unknown device '" + device + "' (expected cpu or cuda)");
}

// The dtype settings of one engine, each resolved once from its flag ("auto" included) and
// read from here by everything built for it.
struct ResolvedDtypes {
  DType kv_cache = DType::F32;
  DType depth_bank = DType::F32;
  bool bf16_linear_inputs = false;
};

ResolvedDtypes resolve_dtypes(const EngineArgs& args, const LoadedModel& model) {
  ResolvedDtypes dtypes;
  dtypes.kv_cache = kv_cache_dtype(args, model);
  dtypes.depth_bank = depth_bank_dtype(args, model);
  dtypes.bf16_linear_inputs = bf16_linear_inputs(args, model);
  return dtypes;
}

// What ModelExecution::description adds for the linear inputs.
std::string linear_inputs_note(bool bf16) { return bf16 ? ", bf16 linear inputs" : ""; }

// The config one rank computes with (its KV heads decide its cache size).
ModelConfig rank_config(const EngineArgs& args, const LoadedModel& model) {
  const int size = tensor_parallel_size(args, model);
  return local_config(model.config, shard_of(model.config, 0, size));
}

TensorParallelOptions parallel_options(const EngineArgs& args, const LoadedModel& model, int size,
                                       int num_kv_blocks, int block_size,
                                       const ResolvedDtypes& dtypes) {
  if (!has_communicator_group(args.device)) {
    if (args.device == "cuda") {
      throw Error("--tensor-parallel-size with --device cuda needs a build with CUDA and NCCL");
    }
    throw_unknown_device(args.device);
  }
  TensorParallelOptions options;
  options.size = size;
  options.num_kv_blocks = num_kv_blocks;
  options.block_size = block_size;
  options.kv_cache_dtype = dtypes.kv_cache;
  options.depth_bank_dtype = dtypes.depth_bank;
  options.sequence_parallel_min_tokens = args.sequence_parallel_min_tokens;
  BackendOptions backend;
  backend.threads = args.threads;
  backend.ranks_sharing_host = size;
  backend.bf16_linear_inputs = dtypes.bf16_linear_inputs;
  options.make_backend = [device = args.device, backend](int rank) {
    BackendOptions for_rank = backend;
    for_rank.device_index = rank;
    return attnres::make_backend(device, for_rank);
  };
  options.make_communicator = make_communicator_group(args.device, size);
  return options;
}

// The backend of this process's rank in a multi-process job (its share of the machine's cores,
// or the GPU of its local rank).
std::unique_ptr<Backend> process_rank_backend(const EngineArgs& args, bool bf16_linear_inputs,
                                              const ProcessGroup& group) {
  if (!has_process_communicator(args.device)) {
    if (!has_backend(args.device)) throw_unknown_device(args.device);
    throw Error("--device " + args.device +
                ": this build has no multi-process communicator for it (mpirun)");
  }
  BackendOptions options;
  options.threads = args.threads;
  options.ranks_sharing_host = group.local_size();
  options.device_index = group.local_rank();
  options.bf16_linear_inputs = bf16_linear_inputs;
  return attnres::make_backend(args.device, options);
}

ShardRank::CommunicatorFactory process_communicator(const std::string& device,
                                                    ProcessGroup& group) {
  return [device, &group](Backend& backend) {
    return make_process_communicator(device, group, backend);
  };
}

std::unique_ptr<ModelExecution> make_process_execution(const EngineArgs& args,
                                                       const LoadedModel& model, int num_kv_blocks,
                                                       int block_size, ProcessGroup& group) {
  if (args.tensor_parallel_size != group.size()) {
    throw Error("--tensor-parallel-size " + std::to_string(args.tensor_parallel_size) +
                ", but the launcher started " + std::to_string(group.size()) +
                " processes (one rank each): pass --tensor-parallel-size " +
                std::to_string(group.size()));
  }
  const ResolvedDtypes dtypes = resolve_dtypes(args, model);
  LoadMessage load;
  load.args = args;
  // Every rank allocates what rank 0 sized: send the resolved dtype, not "auto".
  load.args.kv_cache_dtype = storage_dtype_name(dtypes.kv_cache);
  load.args.depth_bank_dtype = storage_dtype_name(dtypes.depth_bank);
  load.args.linear_input_dtype = dtypes.bf16_linear_inputs ? "bfloat16" : "float32";
  load.num_kv_blocks = num_kv_blocks;
  load.block_size = block_size;
  load.model_summary = model.config.summary();
  auto exec = std::make_unique<ModelExecution>();
  exec->tensor_parallel_size = group.size();
  exec->kv_cache_dtype = dtypes.kv_cache;
  exec->depth_bank_dtype = dtypes.depth_bank;
  auto runner = std::make_unique<ProcessGroupRunner>(
      group, load, model.config, model.weights,
      process_rank_backend(args, dtypes.bf16_linear_inputs, group),
      process_communicator(args.device, group));
  exec->weight_bytes_per_rank = runner->shard().model().weight_bytes();
  exec->bf16_linear_inputs = dtypes.bf16_linear_inputs;
  exec->description = runner->description() + linear_inputs_note(exec->bf16_linear_inputs);
  exec->runner = std::move(runner);
  return exec;
}

}  // namespace

int run_process_rank(ProcessGroup& group) {
  return run_process_worker(group, [&group](const LoadMessage& load) {
    const LoadedModel model = load_model(load.args);
    if (model.config.summary() != load.model_summary) {
      throw Error("it loaded '" + load.args.model + "' as " + model.config.summary() +
                  ", but rank 0 runs " + load.model_summary +
                  " (is the same model at the same path on every machine?)");
    }
    check_tensor_parallel(model.config, group.size());
    const ResolvedDtypes dtypes = resolve_dtypes(load.args, model);  // rank 0's, by name
    ShardRankOptions options;
    options.rank = group.rank();
    options.size = group.size();
    options.num_kv_blocks = load.num_kv_blocks;
    options.block_size = load.block_size;
    options.kv_cache_dtype = dtypes.kv_cache;
    options.depth_bank_dtype = dtypes.depth_bank;
    options.sequence_parallel_min_tokens = load.args.sequence_parallel_min_tokens;
    return std::make_unique<ShardRank>(
        model.config, model.weights, options,
        process_rank_backend(load.args, dtypes.bf16_linear_inputs, group),
        process_communicator(load.args.device, group));
  });
}

LoadedModel load_model(const EngineArgs& args) { return load_model_arg(args.model); }

int tensor_parallel_size(const EngineArgs& args, const LoadedModel& model) {
  check_tensor_parallel(model.config, args.tensor_parallel_size);
  if (args.sequence_parallel_min_tokens < 0) {
    throw Error("--sequence-parallel-min-tokens: must be >= 0");
  }
  return args.tensor_parallel_size;
}

namespace {

// A storage dtype flag (--kv-cache-dtype, --depth-bank-dtype): "auto" = bfloat16 for a bf16
// checkpoint where the backend takes it, else float32; an explicit name the backend must take.
// `reads` finishes the refusal: "attention reads an f32 cache".
DType storage_dtype(const std::string& flag, const std::string& name, const EngineArgs& args,
                    const LoadedModel& model, DTypeSet BackendCapabilities::*supports,
                    const std::string& reads) {
  if (name != "auto" && name != "float32" && name != "bfloat16") {
    throw Error(flag + ": '" + name + "' is not one of auto, bfloat16, float32");
  }
  if (!has_backend(args.device)) return name == "bfloat16" ? DType::BF16 : DType::F32;
  const BackendTraits traits = backend_traits(args.device);
  const DTypeSet& takes = traits.capabilities.*supports;
  if (name == "auto") {
    return model.weights.dtype == DType::BF16 && takes.contains(DType::BF16) ? DType::BF16
                                                                             : DType::F32;
  }
  const DType dtype = storage_dtype_from_name(name, flag);
  if (!takes.contains(dtype)) {
    throw Error(flag + " " + name + ": the " + traits.display_name + " backend's " + reads +
                " (not yet bf16)");
  }
  return dtype;
}

}  // namespace

bool bf16_linear_inputs(const EngineArgs& args, const LoadedModel& model) {
  const std::string& name = args.linear_input_dtype;
  if (name != "auto" && name != "float32" && name != "bfloat16") {
    throw Error("--linear-input-dtype: '" + name + "' is not one of auto, bfloat16, float32");
  }
  if (name == "float32" || !has_backend(args.device)) return false;
  const BackendTraits traits = backend_traits(args.device);
  const bool bf16_weights = model.weights.dtype == DType::BF16;
  if (name == "auto") return bf16_weights && traits.capabilities.prefers_bf16_linear_inputs;
  if (!bf16_weights) {
    throw Error("--linear-input-dtype bfloat16: the checkpoint's weights are " +
                storage_dtype_name(model.weights.dtype) +
                "; inputs are rounded to bf16 only to meet bf16 weights");
  }
  if (!traits.capabilities.bf16_linear_inputs) {
    throw Error("--linear-input-dtype bfloat16: the " + traits.display_name +
                " backend does not compute linears from bf16 inputs here (the CPU needs a "
                "build for a CPU with AVX512_BF16)");
  }
  return true;
}

std::string linear_input_dtype_name(const EngineArgs& args, const LoadedModel& model) {
  return bf16_linear_inputs(args, model) ? "bfloat16" : "float32";
}

DType kv_cache_dtype(const EngineArgs& args, const LoadedModel& model) {
  return storage_dtype("--kv-cache-dtype", args.kv_cache_dtype, args, model,
                       &BackendCapabilities::kv_cache_dtypes, "attention reads an f32 cache");
}

DType depth_bank_dtype(const EngineArgs& args, const LoadedModel& model) {
  return storage_dtype("--depth-bank-dtype", args.depth_bank_dtype, args, model,
                       &BackendCapabilities::depth_bank_dtypes, "depth ops read an f32 bank");
}

size_t kv_bytes_per_block(const EngineArgs& args, const LoadedModel& model, int block_size) {
  return KvCache::bytes_per_block(rank_config(args, model), block_size,
                                  kv_cache_dtype(args, model));
}

int kv_blocks_for_budget(const EngineArgs& args, const LoadedModel& model, int block_size,
                         size_t budget_bytes) {
  return KvCache::blocks_for_budget(rank_config(args, model), block_size, budget_bytes,
                                    kv_cache_dtype(args, model));
}

namespace {

std::unique_ptr<Backend> backend_for(const EngineArgs& args, bool bf16_linear_inputs) {
  if (args.threads < 0) throw Error("--threads: must be >= 0");
  if (!has_backend(args.device)) {
    if (args.device == "cuda" && !registered_backends().empty()) {
      throw Error("--device cuda: this build has no CUDA backend (nvcc was not found)");
    }
    throw_unknown_device(args.device);
  }
  BackendOptions options;
  options.threads = args.threads;
  options.bf16_linear_inputs = bf16_linear_inputs;
  return make_backend(args.device, options);
}

}  // namespace

std::unique_ptr<Backend> make_backend(const EngineArgs& args, const LoadedModel& model) {
  return backend_for(args, bf16_linear_inputs(args, model));
}

std::unique_ptr<ModelExecution> make_model_execution(const EngineArgs& args,
                                                     const LoadedModel& model, int num_kv_blocks,
                                                     int block_size) {
  if (ProcessGroup* group = job_process_group()) {
    tensor_parallel_size(args, model);  // the model's head counts, checked
    return make_process_execution(args, model, num_kv_blocks, block_size, *group);
  }
  auto exec = std::make_unique<ModelExecution>();
  exec->tensor_parallel_size = tensor_parallel_size(args, model);
  const ResolvedDtypes dtypes = resolve_dtypes(args, model);
  exec->kv_cache_dtype = dtypes.kv_cache;
  exec->depth_bank_dtype = dtypes.depth_bank;
  exec->bf16_linear_inputs = dtypes.bf16_linear_inputs;
  if (exec->tensor_parallel_size == 1) {
    exec->backend = backend_for(args, dtypes.bf16_linear_inputs);
    exec->transformer = std::make_unique<Transformer>(model.config, model.weights, *exec->backend,
                                                      ParallelRole{}, exec->depth_bank_dtype);
    RunnerOptions runner;
    runner.kv_dtype = exec->kv_cache_dtype;
    runner.max_graph_batch = args.enforce_eager ? 0 : std::min(args.max_num_seqs, 256);
    exec->runner =
        std::make_unique<TransformerRunner>(*exec->transformer, num_kv_blocks, block_size, runner);
    exec->weight_bytes_per_rank = exec->transformer->weight_bytes();
    exec->description = exec->backend->name() + linear_inputs_note(exec->bf16_linear_inputs);
    return exec;
  }
  auto runner = std::make_unique<TensorParallelRunner>(
      model.config, model.weights,
      parallel_options(args, model, exec->tensor_parallel_size, num_kv_blocks, block_size, dtypes));
  exec->weight_bytes_per_rank = runner->rank_model(0).weight_bytes();
  exec->description = runner->backend_name() + linear_inputs_note(exec->bf16_linear_inputs);
  exec->runner = std::move(runner);
  return exec;
}

EngineConfig make_engine_config(const EngineArgs& args, const LoadedModel& model) {
  const int block_size = args.block_size;
  if (block_size < 1 || block_size > 1024) throw Error("--block-size: must be in [1, 1024]");
  const size_t budget = args.kv_cache_memory_bytes;
  const int num_blocks = kv_blocks_for_budget(args, model, block_size, budget);
  if (num_blocks < 1) {
    throw Error("--kv-cache-memory: " + std::to_string(budget) + " bytes hold no KV block (one " +
                "block takes " + std::to_string(kv_bytes_per_block(args, model, block_size)) +
                " bytes)");
  }
  const int64_t capacity_tokens = static_cast<int64_t>(num_blocks) * block_size;
  int max_model_len = args.max_model_len.value_or(model.config.max_position_embeddings);
  if (max_model_len < 1 || max_model_len > model.config.max_position_embeddings) {
    throw Error("--max-model-len: " + std::to_string(max_model_len) + " is outside [1, " +
                std::to_string(model.config.max_position_embeddings) +
                "] (the model's max_position_embeddings)");
  }
  if (max_model_len > capacity_tokens) {
    if (args.max_model_len) {
      throw Error("--max-model-len " + std::to_string(max_model_len) +
                  " does not fit the KV cache (" + std::to_string(capacity_tokens) +
                  " tokens): raise --kv-cache-memory");
    }
    max_model_len = static_cast<int>(capacity_tokens);
  }

  EngineConfig config;
  config.enable_prefix_caching = args.enable_prefix_caching;
  config.device_sampling = args.device_sampling;
  config.async_scheduling = args.async_scheduling;
  config.scheduler.max_num_seqs = args.max_num_seqs;
  config.scheduler.max_num_batched_tokens = args.max_num_batched_tokens;
  config.scheduler.max_model_len = max_model_len;
  config.scheduler.validate();
  config.num_kv_blocks = num_blocks;
  config.block_size = block_size;
  config.max_queued_requests = args.max_queued_requests;
  if (config.max_queued_requests < 1) throw Error("--max-queued-requests: must be >= 1");
  config.eos_ids = model.eos_token_ids();
  config.make_decoder = make_text_decoder_factory(model.tokenizer);
  config.vocabulary = model.vocabulary();
  if (model.tokenizer) {
    config.constraints =
        make_constraint_compiler(*model.tokenizer, config.vocabulary, config.eos_ids);
  }
  return config;
}

}  // namespace attnres
