#include "engine/sched/model_execution.h"

#include <algorithm>

#include "engine/core/backend_registry.h"
#include "engine/core/error.h"
#include "engine/core/quant_format.h"
#include "engine/model/kv_cache.h"
#include "engine/runner/tensor_parallel.h"
#include "engine/sched/tokenizer_constraints.h"
#include "engine/sched/tokenizer_text_decoder.h"

namespace attnres {
namespace {

// The config one rank computes with (its KV heads decide its cache size).
ModelConfig rank_config(const EngineArgs& args, const LoadedModel& model) {
  const int size = tensor_parallel_size(args, model);
  return local_config(model.config, shard_of(model.config, 0, size));
}

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

LoadedModel load_model(const EngineArgs& args) {
  if (!args.quantization.empty()) {
    if (args.tensor_parallel_size > 1 || in_multi_process_job()) {
      throw Error("--quantization " + args.quantization +
                  " with tensor parallelism is not supported yet (quantized weights are not "
                  "sharded across ranks)");
    }
    // Asked before quantizing: a backend that cannot read the format fails in a second, not
    // after the whole model was quantized.
    if (has_backend(args.device)) {
      const DType recipe = quant_format_from_name(args.quantization, "--quantization");
      const auto& reads = backend_traits(args.device).capabilities.weight_dtypes;
      const std::vector<DType> formats = recipe_formats(recipe);
      if (!std::ranges::all_of(formats, [&](DType f) { return reads.contains(f); })) {
        throw Error("--quantization " + args.quantization + " is not supported by the " +
                    backend_traits(args.device).display_name + " backend yet");
      }
    }
  }
  return load_model_arg(args.model, {args.quantization, args.threads});
}

int tensor_parallel_size(const EngineArgs& args, const LoadedModel& model) {
  check_tensor_parallel(model.config, args.tensor_parallel_size);
  if (args.sequence_parallel_min_tokens < 0) {
    throw Error("--sequence-parallel-min-tokens: must be >= 0");
  }
  return args.tensor_parallel_size;
}

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

RunnerArgs resolve_runner_args(const EngineArgs& args, const LoadedModel& model) {
  RunnerArgs resolved;
  resolved.model = args.model;
  resolved.device = args.device;
  resolved.threads = args.threads;
  resolved.tensor_parallel_size = tensor_parallel_size(args, model);
  resolved.sequence_parallel_min_tokens = args.sequence_parallel_min_tokens;
  resolved.kv_cache_dtype = kv_cache_dtype(args, model);
  resolved.depth_bank_dtype = depth_bank_dtype(args, model);
  resolved.bf16_linear_inputs = bf16_linear_inputs(args, model);
  resolved.max_graph_batch = args.enforce_eager ? 0 : std::min(args.max_num_seqs, 256);
  return resolved;
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

std::unique_ptr<Backend> make_backend(const EngineArgs& args, const LoadedModel& model) {
  RunnerArgs resolved;
  resolved.device = args.device;
  resolved.threads = args.threads;
  resolved.bf16_linear_inputs = bf16_linear_inputs(args, model);
  return make_backend(resolved);
}

std::unique_ptr<ModelExecution> make_model_execution(const EngineArgs& args,
                                                     const LoadedModel& model, int num_kv_blocks,
                                                     int block_size) {
  return make_model_execution(resolve_runner_args(args, model), model, num_kv_blocks, block_size);
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
