// EngineArgs: everything that decides how a model runs and how the serving engine around it
// is sized, in one parameter struct with the defaults of `attnres`. The attnres command only
// maps its flags onto it (server/cli: --device, --tensor-parallel-size, --kv-cache-memory, ...
// and their ATTNRES_* variables); tests fill it directly. engine/sched/model_execution.h builds
// from it what runs the model and the EngineConfig of `attnres serve`.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace attnres {

struct EngineArgs {
  // --- the model and where it runs (every command) ---
  std::string model;             // --model: a model directory or builtin:NAME; "" = the demo
  std::string device = "cpu";    // --device: a registered backend name
  int threads = 0;               // --threads: CPU threads, 0 = all cores (shared among ranks)
  int tensor_parallel_size = 1;  // --tensor-parallel-size
  // --quantization: "" (the checkpoint's weights as stored) | "int8" | "int4": quantize every
  // float weight matrix at load (engine/model/quantize_weights.h).
  std::string quantization;
  int sequence_parallel_min_tokens = 128;  // --sequence-parallel-min-tokens (0 = never)
  // --kv-cache-dtype: "auto" | "bfloat16" | "float32". auto = bfloat16 when the checkpoint's
  // weights are bf16 and the backend's attention reads a bf16 cache, else float32
  // (model_execution.h: kv_cache_dtype).
  std::string kv_cache_dtype = "auto";
  // --depth-bank-dtype: the same choice for the AttnRes depth bank (model_execution.h:
  // depth_bank_dtype).
  std::string depth_bank_dtype = "auto";
  // --linear-input-dtype: "auto" | "bfloat16" | "float32", what a linear's input rows are
  // rounded to before they meet bf16 weights (model_execution.h: bf16_linear_inputs). auto =
  // bfloat16 for a bf16 checkpoint on a backend whose bf16 dot products are the faster ones
  // (the CPU with AVX512_BF16 where vdpbf16ps outruns f32 FMAs: Zen 4), else float32.
  std::string linear_input_dtype = "auto";
  // --enforce-eager: run every step op by op, never as a replayed step graph (graphs are
  // used only where the backend records them: CUDA; engine/runner/decode_graphs.h).
  bool enforce_eager = false;

  // --- the serving engine (attnres serve) ---
  size_t kv_cache_memory_bytes = size_t{1} << 30;  // --kv-cache-memory, per rank
  int block_size = 16;                             // --block-size
  std::optional<int> max_model_len;   // --max-model-len; unset: the model's, capped by the cache
  int max_num_seqs = 256;             // --max-num-seqs
  int max_num_batched_tokens = 2048;  // --max-num-batched-tokens
  int max_queued_requests = 1024;     // --max-queued-requests
  bool enable_prefix_caching = true;  // --[no-]enable-prefix-caching
  // --no-device-sampling turns it off: sample on the device where the runner can
  // (EngineConfig::device_sampling); the same tokens either way, so off only to compare or to
  // debug a backend's sample op. Every command that runs the engine takes it.
  bool device_sampling = true;
  // --no-async-scheduling turns it off: the host delivers step n-1's outputs while the device
  // runs step n (EngineConfig::async_scheduling; only where the runner launches asynchronously,
  // i.e. CUDA). The same tokens either way. Every command that runs the engine takes it.
  bool async_scheduling = true;
};

}  // namespace attnres
