#include "engine/runner/runner_factory.h"

#include "engine/core/backend_registry.h"
#include "engine/core/error.h"
#include "engine/parallel/communicator_registry.h"
#include "engine/runner/process_runner.h"
#include "engine/runner/tensor_parallel.h"
#include "engine/runner/tensor_parallel_runner.h"
#include "engine/runner/transformer_runner.h"

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

// What ModelExecution::description adds for the linear inputs.
std::string linear_inputs_note(bool bf16) { return bf16 ? ", bf16 linear inputs" : ""; }

TensorParallelOptions parallel_options(const RunnerArgs& args, int num_kv_blocks, int block_size) {
  if (!has_communicator_group(args.device)) {
    if (args.device == "cuda") {
      throw Error("--tensor-parallel-size with --device cuda needs a build with CUDA and NCCL");
    }
    throw_unknown_device(args.device);
  }
  const int size = args.tensor_parallel_size;
  TensorParallelOptions options;
  options.size = size;
  options.num_kv_blocks = num_kv_blocks;
  options.block_size = block_size;
  options.kv_cache_dtype = args.kv_cache_dtype;
  options.depth_bank_dtype = args.depth_bank_dtype;
  options.sequence_parallel_min_tokens = args.sequence_parallel_min_tokens;
  BackendOptions backend;
  backend.threads = args.threads;
  backend.ranks_sharing_host = size;
  backend.bf16_linear_inputs = args.bf16_linear_inputs;
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
std::unique_ptr<Backend> process_rank_backend(const RunnerArgs& args, const ProcessGroup& group) {
  if (!has_process_communicator(args.device)) {
    if (!has_backend(args.device)) throw_unknown_device(args.device);
    throw Error("--device " + args.device +
                ": this build has no multi-process communicator for it (mpirun)");
  }
  BackendOptions options;
  options.threads = args.threads;
  options.ranks_sharing_host = group.local_size();
  options.device_index = group.local_rank();
  options.bf16_linear_inputs = args.bf16_linear_inputs;
  return attnres::make_backend(args.device, options);
}

ShardRank::CommunicatorFactory process_communicator(const std::string& device,
                                                    ProcessGroup& group) {
  return [device, &group](Backend& backend) {
    return make_process_communicator(device, group, backend);
  };
}

// The ModelExecution fields every runner kind fills alike.
std::unique_ptr<ModelExecution> execution_of(const RunnerArgs& args) {
  auto exec = std::make_unique<ModelExecution>();
  exec->tensor_parallel_size = args.tensor_parallel_size;
  exec->kv_cache_dtype = args.kv_cache_dtype;
  exec->depth_bank_dtype = args.depth_bank_dtype;
  exec->bf16_linear_inputs = args.bf16_linear_inputs;
  return exec;
}

std::unique_ptr<ModelExecution> make_process_execution(const RunnerArgs& args,
                                                       const LoadedModel& model, int num_kv_blocks,
                                                       int block_size, ProcessGroup& group) {
  if (args.tensor_parallel_size != group.size()) {
    throw Error("--tensor-parallel-size " + std::to_string(args.tensor_parallel_size) +
                ", but the launcher started " + std::to_string(group.size()) +
                " processes (one rank each): pass --tensor-parallel-size " +
                std::to_string(group.size()));
  }
  LoadMessage load;
  load.args = args;  // resolved: every rank allocates what rank 0 sized
  load.num_kv_blocks = num_kv_blocks;
  load.block_size = block_size;
  load.model_summary = model.config.summary();
  auto exec = execution_of(args);
  auto runner = std::make_unique<ProcessGroupRunner>(group, load, model.config, model.weights,
                                                     process_rank_backend(args, group),
                                                     process_communicator(args.device, group));
  exec->weight_bytes_per_rank = runner->shard().model().weight_bytes();
  exec->description = runner->description() + linear_inputs_note(args.bf16_linear_inputs);
  exec->runner = std::move(runner);
  return exec;
}

}  // namespace

std::unique_ptr<Backend> make_backend(const RunnerArgs& args) {
  if (args.threads < 0) throw Error("--threads: must be >= 0");
  if (!has_backend(args.device)) {
    if (args.device == "cuda" && !registered_backends().empty()) {
      throw Error("--device cuda: this build has no CUDA backend (nvcc was not found)");
    }
    throw_unknown_device(args.device);
  }
  BackendOptions options;
  options.threads = args.threads;
  options.bf16_linear_inputs = args.bf16_linear_inputs;
  return make_backend(args.device, options);
}

std::unique_ptr<ModelExecution> make_model_execution(const RunnerArgs& args,
                                                     const LoadedModel& model, int num_kv_blocks,
                                                     int block_size) {
  check_tensor_parallel(model.config, args.tensor_parallel_size);
  if (ProcessGroup* group = job_process_group()) {
    return make_process_execution(args, model, num_kv_blocks, block_size, *group);
  }
  auto exec = execution_of(args);
  if (args.tensor_parallel_size == 1) {
    exec->backend = make_backend(args);
    exec->transformer = std::make_unique<Transformer>(model.config, model.weights, *exec->backend,
                                                      ParallelRole{}, args.depth_bank_dtype);
    RunnerOptions runner;
    runner.kv_dtype = args.kv_cache_dtype;
    runner.max_graph_batch = args.max_graph_batch;
    exec->runner =
        std::make_unique<TransformerRunner>(*exec->transformer, num_kv_blocks, block_size, runner);
    exec->weight_bytes_per_rank = exec->transformer->weight_bytes();
    exec->description = exec->backend->name() + linear_inputs_note(args.bf16_linear_inputs);
    return exec;
  }
  auto runner = std::make_unique<TensorParallelRunner>(
      model.config, model.weights, parallel_options(args, num_kv_blocks, block_size));
  exec->weight_bytes_per_rank = runner->rank_model(0).weight_bytes();
  exec->description = runner->backend_name() + linear_inputs_note(args.bf16_linear_inputs);
  exec->runner = std::move(runner);
  return exec;
}

int run_process_rank(ProcessGroup& group) {
  return run_process_worker(group, [&group](const LoadMessage& load) {
    const LoadedModel model = load_model_arg(load.args.model);
    if (model.config.summary() != load.model_summary) {
      throw Error("it loaded '" + load.args.model + "' as " + model.config.summary() +
                  ", but rank 0 runs " + load.model_summary +
                  " (is the same model at the same path on every machine?)");
    }
    check_tensor_parallel(model.config, group.size());
    ShardRankOptions options;
    options.rank = group.rank();
    options.size = group.size();
    options.num_kv_blocks = load.num_kv_blocks;
    options.block_size = load.block_size;
    options.kv_cache_dtype = load.args.kv_cache_dtype;
    options.depth_bank_dtype = load.args.depth_bank_dtype;
    options.sequence_parallel_min_tokens = load.args.sequence_parallel_min_tokens;
    return std::make_unique<ShardRank>(model.config, model.weights, options,
                                       process_rank_backend(load.args, group),
                                       process_communicator(load.args.device, group));
  });
}

bool in_multi_process_job() { return job_process_group() != nullptr; }

}  // namespace attnres
