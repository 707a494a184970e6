// The `attnres` subcommands, and what they share: model/backend flags and sampling flags.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "clients/cli_flags/flags.h"
#include "clients/cli_flags/sampling_flags.h"
#include "engine/core/backend.h"
#include "engine/model/loaded_model.h"
#include "engine/sample/sampling_params.h"
#include "engine/sched/engine_args.h"

namespace attnres::cli {

int run_serve(const std::vector<std::string>& args);
int run_generate(const std::vector<std::string>& args);
int run_inspect(const std::vector<std::string>& args);
int run_logits(const std::vector<std::string>& args);
int run_perplexity(const std::vector<std::string>& args);
int run_bench(const std::vector<std::string>& args);
int run_quantize(const std::vector<std::string>& args);
// `bench serve` (cmd_bench_serve.cpp): the serving benchmark against a running server.
int run_bench_serve(const std::vector<std::string>& args);

// --model, --device, --threads.
std::vector<FlagSpec> model_flags();
// The model named by --model (a directory, builtin:NAME, or the demo model when absent).
LoadedModel load_model_from_flags(const Flags& flags);
// The --quantization log line (matrices, time, weight bytes, resident memory) on stderr,
// when the model was quantized at load.
void report_quantization(const LoadedModel& model);
// --device auto: "cuda" when the CUDA backend is built and reports a visible GPU, else "cpu";
// any other value as given.
std::string resolve_device(const std::string& device);
// The model flags (--model, --device, --threads, --tensor-parallel-size, --kv-cache-dtype,
// --sequence-parallel-min-tokens) mapped onto EngineArgs; serve adds its own.
EngineArgs engine_args_from_flags(const Flags& flags);
// Sampling parameters: flags first, then generation_config.json defaults, then ours.
SamplingParams sampling_from_flags(const Flags& flags, const LoadedModel& model);

// Prints usage when --help is among args; returns true if it did.
bool print_help_if_asked(const std::vector<std::string>& args, const std::string& command,
                         const std::string& summary, const std::vector<FlagSpec>& specs);

}  // namespace attnres::cli
