#include "server/cli/commands.h"

#include <iostream>

#include "engine/core/backend_registry.h"
#include "engine/core/error.h"
#include "engine/sched/model_execution.h"

namespace attnres::cli {

std::vector<FlagSpec> model_flags() {
  return {
      {"model", "DIR", "Hugging Face model directory, or builtin:NAME (default: builtin:demo)"},
      {"device", "auto|cpu|cuda",
       "backend to run on: auto = cuda when this is a CUDA build and a GPU is visible, else "
       "cpu (default auto; the CUDA server is not yet verified end to end on a GPU: "
       "README, \"Status\")"},
      {"threads", "N", "CPU threads (default: all cores; shared among the ranks)"},
      {"quantization", "int8|int4",
       "quantize every weight matrix (projections, embedding, LM head) at load: int8 = 8.5 "
       "bits per weight (blocks of 32, f16 scales); int4 = 4.5 for the projections (int4k), "
       "6.56 (int6k) for the embedding, LM head and Q4_K_M's 6-bit layers (super-blocks of "
       "256 with integer block scales, llama.cpp's k-quant structure); norms, biases and AttnRes "
       "depth-mix weights stay as stored (default: the checkpoint's weights as stored)"},
      {"tensor-parallel-size", "N",
       "split the model across N ranks: N GPUs over NCCL with --device cuda, N thread "
       "groups on the CPU (default 1)"},
      {"sequence-parallel-min-tokens", "N",
       "with N > 1 ranks: steps with at least this many prefill tokens shard the depth "
       "bank along the sequence (default 128; 0 = never)"},
      {"kv-cache-dtype", "auto|bfloat16|float32",
       "what the KV cache stores: bfloat16 holds twice the tokens per byte (K/V rounded to "
       "nearest even); auto = bfloat16 for a bf16 checkpoint "
       "on a backend that supports it, else float32 (default auto)"},
      {"depth-bank-dtype", "auto|bfloat16|float32",
       "what the AttnRes depth bank (the earlier layers' outputs the depth mixes read) "
       "stores: bfloat16 takes half the memory (entries rounded to nearest even); "
       "auto = bfloat16 for a bf16 checkpoint on a backend that "
       "supports it, else float32 (default auto)"},
      {"linear-input-dtype", "auto|bfloat16|float32",
       "what a linear's input rows (and, over a bf16 KV cache, attention's queries and "
       "softmax weights) are rounded to before they meet bf16 weights (or K / V): bfloat16 "
       "doubles the CPU's multiply rate where it has AVX512_BF16 (vdpbf16ps, e.g. Zen 4), as "
       "a bf16 model's own PyTorch code rounds them; float32 keeps them exact; auto = "
       "bfloat16 for a bf16 checkpoint on a CPU where that is faster, else float32 "
       "(default auto)"},
      {"enforce-eager", "",
       "run every step op by op: no replayed CUDA graphs for decode steps (graphs are "
       "only used with --device cuda)"},
      {"no-device-sampling", "",
       "sample every token on the host from downloaded logits instead of with the "
       "backend's sample op (the same tokens either way; to compare or to debug)"},
      {"no-async-scheduling", "",
       "run each engine step strictly in order instead of handing the last step's outputs "
       "to their streams while the device runs the next (the overlap needs a backend that "
       "samples asynchronously: cuda; the same tokens either way)"},
  };
}

std::string resolve_device(const std::string& device) {
  if (device != "auto") return device;
  return has_backend("cuda") && backend_traits("cuda").device_available() ? "cuda" : "cpu";
}

LoadedModel load_model_from_flags(const Flags& flags) {
  LoadedModel model = load_model(engine_args_from_flags(flags));
  report_quantization(model);
  return model;
}

void report_quantization(const LoadedModel& model) {
  if (!model.quantized) return;
  std::cerr << model.quantized->line() << "; resident memory " << resident_memory_bytes() / 1000000
            << " MB\n";
}

EngineArgs engine_args_from_flags(const Flags& flags) {
  EngineArgs args;
  args.model = flags.get("model");
  args.device = resolve_device(flags.get("device", "auto"));
  args.threads = flags.get_int("threads", 0);
  args.tensor_parallel_size = flags.get_int("tensor-parallel-size", 1);
  args.quantization = flags.get("quantization", "");
  args.sequence_parallel_min_tokens = flags.get_int("sequence-parallel-min-tokens", 128);
  args.kv_cache_dtype = flags.get("kv-cache-dtype", "auto");
  args.depth_bank_dtype = flags.get("depth-bank-dtype", "auto");
  args.linear_input_dtype = flags.get("linear-input-dtype", "auto");
  args.enforce_eager = flags.has("enforce-eager");
  args.device_sampling = !flags.has("no-device-sampling");
  args.async_scheduling = !flags.has("no-async-scheduling");
  return args;
}

SamplingParams sampling_from_flags(const Flags& flags, const LoadedModel& model) {
  const GenerationDefaults& defaults = model.config.generation;
  SamplingParams p;
  p.max_tokens = flags.get_int("max-tokens", 64);
  p.temperature = static_cast<float>(
      flags.get_optional_double("temperature").value_or(defaults.temperature.value_or(1.0f)));
  p.top_p = static_cast<float>(
      flags.get_optional_double("top-p").value_or(defaults.top_p.value_or(1.0f)));
  p.top_k = flags.get_optional_int("top-k").value_or(defaults.top_k.value_or(0));
  p.min_p = static_cast<float>(
      flags.get_optional_double("min-p").value_or(defaults.min_p.value_or(0.0f)));
  p.repetition_penalty =
      static_cast<float>(flags.get_optional_double("repetition-penalty")
                             .value_or(defaults.repetition_penalty.value_or(1.0f)));
  p.presence_penalty = static_cast<float>(flags.get_double("presence-penalty", 0.0));
  p.frequency_penalty = static_cast<float>(flags.get_double("frequency-penalty", 0.0));
  for (const std::string& item : flags.get_all("logit-bias")) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos)
      throw Error("--logit-bias: expected ID:BIAS, got '" + item + "'");
    try {
      p.logit_bias.emplace_back(std::stoi(item.substr(0, colon)),
                                std::stof(item.substr(colon + 1)));
    } catch (const std::exception&) {
      throw Error("--logit-bias: expected ID:BIAS, got '" + item + "'");
    }
  }
  if (auto seed = flags.get_optional_double("seed")) {
    if (*seed < 0) throw Error("--seed: must be >= 0");
    p.seed = static_cast<uint64_t>(*seed);
  }
  p.stop = flags.get_all("stop");
  p.stop_token_ids = flags.get_int_list("stop-token-ids");
  p.ignore_eos = flags.has("ignore-eos");
  p.min_tokens = flags.get_int("min-tokens", 0);
  p.logprobs = flags.get_int("logprobs", -1);
  p.validate(model.vocabulary());
  return p;
}

bool print_help_if_asked(const std::vector<std::string>& args, const std::string& command,
                         const std::string& summary, const std::vector<FlagSpec>& specs) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << Flags::usage(command, summary, specs);
      return true;
    }
  }
  return false;
}

}  // namespace attnres::cli
