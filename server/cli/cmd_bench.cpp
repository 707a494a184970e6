// attnres bench latency: engine-only latency at a fixed batch, input and output length,
// reported next to the memory-bandwidth floor (PERF.md). Several --model values are loaded
// into the same process and their iterations alternate; they are reported as ratios to the
// first and to their no-AttnRes twin (the plain model of the same shape, when one is in the
// run), paired iteration by iteration: run an AttnRes model and its twin together to read
// the AttnRes overhead. --modes SIZE runs the
// built-in plain-SIZE and attnres-SIZE in every attnres_mode (docs/ATTNRES.md §2d).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/parallel/process_group.h"
#include "engine/sched/model_execution.h"
#include "engine/sched/offline_generator.h"
#include "engine/sched/tokenizer_constraints.h"
#include "kernels/cpu/memory_bandwidth.h"
#include "server/cli/commands.h"

namespace attnres::cli {
namespace {

struct LatencyResult {
  std::string model;
  std::string runs_on;  // ModelExecution::description: backend, threads, bf16 linear inputs
  bool attnres = false;
  int hidden = 0, layers = 0;     // the shape, to find the no-AttnRes twin
  double prefill_seconds = 0;     // median over iterations
  double decode_ms_per_step = 0;  // median
  double bytes_per_step = 0;
  double floor_ms = 0;
  std::vector<double> prefill, decode;  // per measured iteration: seconds, ms per step
  // The process's resident memory (VmRSS) after the model's runs, while it is loaded: with
  // one model per run, its weights (quantized or not: --quantization), cache and buffers.
  size_t resident_bytes = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The median over iterations of a's time over b's, paired iteration by iteration (with the
// models alternating, iteration i of each ran within seconds of the other), minus 1:
// positive means a is slower.
double paired_overhead(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> ratios;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) ratios.push_back(a[i] / b[i]);
  return median(ratios) - 1.0;
}

std::vector<GenerationRequest> random_requests(int batch, int input_len, int output_len, int vocab,
                                               uint64_t seed,
                                               const std::optional<OutputConstraint>& constraint) {
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  std::vector<GenerationRequest> requests(batch);
  for (GenerationRequest& r : requests) {
    for (int i = 0; i < input_len; ++i) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      r.prompt_ids.push_back(static_cast<int32_t>(state % static_cast<uint64_t>(vocab)));
    }
    r.params.temperature = 0;
    r.params.max_tokens = output_len;
    r.params.ignore_eos = true;
    r.params.skip_special_tokens = true;
    r.params.constraint = constraint;
  }
  return requests;
}

// --json-schema: every sequence constrained to that schema (JSON text, or @FILE).
std::optional<OutputConstraint> json_schema_constraint(const Flags& flags) {
  if (!flags.has("json-schema")) return std::nullopt;
  OutputConstraint c;
  c.kind = ConstraintKind::JsonSchema;
  c.field = "--json-schema";
  c.spec = flags.get("json-schema");
  if (!c.spec.empty() && c.spec[0] == '@') {
    std::ifstream in(c.spec.substr(1));
    if (!in) throw Error("--json-schema: cannot read " + c.spec.substr(1));
    c.spec.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return c;
}

// The engine flags with --model set to one of the models a latency run compares.
EngineArgs model_args(const std::string& model_arg, const Flags& flags) {
  EngineArgs args = engine_args_from_flags(flags);
  args.model = model_arg;
  return args;
}

// One model of a latency run: loaded and ready, then measured one iteration at a time, so
// that several models' iterations can alternate.
class LatencyRun {
 public:
  LatencyRun(const std::string& model_arg, const Flags& flags)
      : model_(load_model(model_args(model_arg, flags))),
        batch_(flags.get_int("batch", 1)),
        input_len_(flags.get_int("input-len", 128)),
        output_len_(flags.get_int("output-len", 32)),
        constraint_(json_schema_constraint(flags)) {
    report_quantization(model_);
    vocab_ = std::min(model_.config.vocab_size, model_.tokenizer->vocab_size());
    OfflineGeneratorOptions options;
    options.max_model_len = model_.config.max_position_embeddings;
    const std::vector<GenerationRequest> shape =
        random_requests(batch_, input_len_, output_len_, vocab_, 0, constraint_);
    OfflineGenerator::validate(shape, model_.vocabulary(), options.max_model_len);
    options.num_kv_blocks = OfflineGenerator::blocks_needed(shape, options.block_size);
    EngineArgs args = engine_args_from_flags(flags);
    args.model = model_arg;  // --model repeats: this run's (what other ranks load under mpirun)
    options.device_sampling = args.device_sampling;
    options.async_scheduling = args.async_scheduling;
    exec_ = make_model_execution(args, model_, options.num_kv_blocks, options.block_size);
    generator_ = std::make_unique<OfflineGenerator>(*exec_->runner, model_.tokenizer,
                                                    model_.eos_token_ids(), options);
    if (constraint_) report_compile_times();
  }

  // Structured output's one-time costs on this model's vocabulary, with a fresh compiler: the
  // vocabulary handed to xgrammar (with a JSON-object grammar), then the --json-schema.
  void report_compile_times() const {
    using Clock = std::chrono::steady_clock;
    auto ms = [](Clock::duration d) {
      return std::chrono::duration<double, std::milli>(d).count();
    };
    const Clock::time_point start = Clock::now();
    auto compiler =
        make_constraint_compiler(*model_.tokenizer, model_.vocabulary(), model_.eos_token_ids());
    OutputConstraint object;
    object.kind = ConstraintKind::JsonObject;
    compiler->compile(object);
    const Clock::time_point handed = Clock::now();
    compiler->compile(*constraint_);
    const Clock::time_point compiled = Clock::now();
    std::printf(
        "structured output: vocabulary to xgrammar + JSON-object grammar %.1f ms; "
        "--json-schema (%zu bytes) compiled in %.1f ms\n",
        ms(handed - start), constraint_->spec.size(), ms(compiled - handed));
  }

  // Iteration `it` (its prompts seeded by it); recorded unless it is a warm-up.
  void iterate(int it, bool measured) {
    GenerationTimings t;
    for (const GenerationResult& result : generator_->generate(
             random_requests(batch_, input_len_, output_len_, vocab_, it, constraint_), {}, &t)) {
      if (!result.error.empty()) throw Error("bench latency: a sequence failed: " + result.error);
    }
    if (!measured) return;
    prefill_.push_back(t.prefill_seconds);
    decode_.push_back(t.decode_seconds * 1e3 / std::max(1, t.decode_steps));
  }

  LatencyResult result(const Flags& flags, double bandwidth_gbps) const {
    const ModelConfig& c = model_.config;
    // A decode step reads every weight once (the embedding only by row) and each sequence's
    // K/V cache (f32 or bf16: --kv-cache-dtype) at its average context length. Under tensor
    // parallelism the ranks read their slices at the same time: the floor is one rank's
    // bytes (on the CPU the ranks share one memory bus, so it is all ranks' bytes).
    const double kv_bytes_per_token = 2.0 * c.num_layers * c.num_kv_heads * c.head_dim *
                                      static_cast<double>(dtype_size(exec_->kv_cache_dtype));
    const bool shared_memory_bus = flags.get("device", "cpu") == "cpu";
    const double weight_bytes = static_cast<double>(exec_->weight_bytes_per_rank) *
                                (shared_memory_bus ? exec_->tensor_parallel_size : 1);
    const double avg_context = input_len_ + output_len_ / 2.0;
    LatencyResult r;
    r.model = model_.source;
    r.runs_on = exec_->description;
    r.attnres = c.attnres_mode != AttnResMode::None;
    r.hidden = c.hidden_size;
    r.layers = c.num_layers;
    r.prefill = prefill_;
    r.decode = decode_;
    r.prefill_seconds = median(prefill_);
    r.decode_ms_per_step = median(decode_);
    r.bytes_per_step = weight_bytes + batch_ * avg_context * kv_bytes_per_token /
                                          (shared_memory_bus ? 1 : exec_->tensor_parallel_size);
    r.floor_ms = r.bytes_per_step / (bandwidth_gbps * 1e9) * 1e3;
    r.resident_bytes = resident_memory_bytes();
    return r;
  }

 private:
  LoadedModel model_;
  int batch_, input_len_, output_len_, vocab_ = 0;
  std::optional<OutputConstraint> constraint_;
  std::unique_ptr<ModelExecution> exec_;
  std::unique_ptr<OfflineGenerator> generator_;
  std::vector<double> prefill_, decode_;  // per measured iteration: seconds, ms per step
};

// Every model's results. In one process the models are all loaded first and their
// iterations alternate (model 1, model 2, ..., then model 2, 3, ..., 1), so that a slow
// minute of a shared machine lands on every model alike; a multi-process job (mpirun) loads and
// runs one model at a time, because its other ranks follow one model.
std::vector<LatencyResult> measure_all(const std::vector<std::string>& models, const Flags& flags,
                                       double bandwidth) {
  const int iters = flags.get_int("iters", 3);
  const int warmup = flags.get_int("warmup", 1);
  if (flags.get_int("batch", 1) < 1 || flags.get_int("input-len", 128) < 1 ||
      flags.get_int("output-len", 32) < 2 || iters < 1 || warmup < 0) {
    throw Error("--batch, --input-len, --iters must be >= 1 and --output-len >= 2");
  }
  std::vector<LatencyResult> results;
  if (job_process_group() != nullptr) {
    for (const std::string& m : models) {
      LatencyRun run(m, flags);
      for (int it = 0; it < warmup + iters; ++it) run.iterate(it, it >= warmup);
      results.push_back(run.result(flags, bandwidth));
    }
    return results;
  }
  std::vector<std::unique_ptr<LatencyRun>> runs;
  for (const std::string& m : models) runs.push_back(std::make_unique<LatencyRun>(m, flags));
  for (int it = 0; it < warmup + iters; ++it) {
    // Each iteration starts one model later, so that none always runs first (or right after
    // the same model).
    for (size_t k = 0; k < runs.size(); ++k) {
      runs[(k + static_cast<size_t>(it)) % runs.size()]->iterate(it, it >= warmup);
    }
  }
  for (const auto& run : runs) results.push_back(run->result(flags, bandwidth));
  return results;
}

int run_latency(const std::vector<std::string>& args) {
  std::vector<FlagSpec> specs = model_flags();
  specs[0].repeatable = true;
  std::vector<FlagSpec> own = {
      {"batch", "B", "sequences decoded together (default 1)"},
      {"input-len", "I", "prompt tokens per sequence (default 128)"},
      {"output-len", "O", "generated tokens per sequence (default 32)"},
      {"iters", "N", "measured repetitions; medians are reported (default 3)"},
      {"warmup", "N", "unmeasured repetitions first (default 1)"},
      {"json", "FILE", "also write the results as JSON"},
      {"json-schema", "SCHEMA",
       "constrain every sequence to this JSON schema (JSON text or @FILE): structured "
       "output's cost"},
      {"modes", "SIZE",
       "100m or 0.6b: the built-in plain twin, then that AttnRes shape in every "
       "attnres_mode (added to any --model)"},
  };
  specs.insert(specs.end(), own.begin(), own.end());
  if (print_help_if_asked(
          args, "bench latency",
          "Engine latency: prefill tokens/s and decode ms per step against the\n"
          "memory-bandwidth floor. Repeat --model to compare (e.g. builtin:attnres-100m\n"
          "and builtin:plain-100m): the models are loaded together and their iterations\n"
          "alternate; 'vs twin' is an AttnRes model's time over its plain twin's, paired\n"
          "iteration by iteration (median; positive: slower).",
          specs)) {
    return 0;
  }
  Flags flags(specs, args);
  std::vector<std::string> models = flags.get_all("model");
  if (flags.has("modes")) {
    const std::string size = flags.get("modes");
    models.push_back("builtin:plain-" + size);
    for (const char* mode :
         {"block", "full", "delta", "delta_block", "delta_v", "first_layer", "pre_gated"}) {
      models.push_back("builtin:attnres-" + size + "@" + mode);
    }
  }
  if (models.empty()) models.push_back("");
  const double bandwidth = measure_copy_bandwidth_gbps();
  const int batch = flags.get_int("batch", 1);
  const int input_len = flags.get_int("input-len", 128);
  const std::vector<LatencyResult> results = measure_all(models, flags, bandwidth);
  std::printf("memory bandwidth (copy, read+write): %.1f GB/s\n", bandwidth);
  for (const LatencyResult& r : results) std::printf("%s: %s\n", r.model.c_str(), r.runs_on.c_str());
  // The weights (quantized or not: --quantization) dominate it; compare runs of one model each.
  size_t resident = 0;
  for (const LatencyResult& r : results) resident = std::max(resident, r.resident_bytes);
  std::printf("resident memory (VmRSS) with the models loaded: %.0f MB\n",
              static_cast<double>(resident) / 1e6);
  std::printf("batch %d, input %d, output %d\n\n", batch, input_len,
              flags.get_int("output-len", 32));
  std::printf("%-36s %14s %14s %12s %10s %10s %10s %10s\n", "model", "prefill tok/s",
              "decode ms/step", "floor ms", "of floor", "vs first", "prefill vs", "decode vs");
  std::printf("%-36s %14s %14s %12s %10s %10s %10s %10s\n", "", "", "", "", "", "", "twin", "twin");
  nlohmann::json out = nlohmann::json::array();
  const double first_decode = results.front().decode_ms_per_step;
  for (size_t k = 0; k < results.size(); ++k) {
    const LatencyResult& r = results[k];
    const double prefill_tps = batch * input_len / r.prefill_seconds;
    // The twin: a plain model of the same shape in this run.
    const LatencyResult* twin = nullptr;
    for (const LatencyResult& o : results) {
      if (!o.attnres && o.hidden == r.hidden && o.layers == r.layers) twin = &o;
    }
    char prefill_vs[32] = "-", decode_vs[32] = "-";
    if (r.attnres && twin) {
      std::snprintf(prefill_vs, sizeof(prefill_vs), "%+.1f%%",
                    100.0 * paired_overhead(r.prefill, twin->prefill));
      std::snprintf(decode_vs, sizeof(decode_vs), "%+.1f%%",
                    100.0 * paired_overhead(r.decode, twin->decode));
    }
    std::printf("%-36s %14.1f %14.3f %12.3f %9.1f%% %9.3fx %10s %10s\n", r.model.c_str(),
                prefill_tps, r.decode_ms_per_step, r.floor_ms,
                100.0 * r.floor_ms / r.decode_ms_per_step, r.decode_ms_per_step / first_decode,
                prefill_vs, decode_vs);
    out.push_back({{"model", r.model},
                   {"runs_on", r.runs_on},
                   {"batch", batch},
                   {"input_len", input_len},
                   {"output_len", flags.get_int("output-len", 32)},
                   {"prefill_tokens_per_s", prefill_tps},
                   {"decode_ms_per_step", r.decode_ms_per_step},
                   {"bytes_per_step", r.bytes_per_step},
                   {"floor_ms", r.floor_ms},
                   {"fraction_of_floor", r.floor_ms / r.decode_ms_per_step},
                   {"bandwidth_gbps", bandwidth},
                   {"prefill_seconds_per_iteration", r.prefill},
                   {"decode_ms_per_iteration", r.decode}});
    if (r.attnres && twin) {
      out.back()["prefill_overhead_vs_twin"] = paired_overhead(r.prefill, twin->prefill);
      out.back()["decode_overhead_vs_twin"] = paired_overhead(r.decode, twin->decode);
    }
  }
  std::fflush(stdout);
  if (flags.has("json")) std::ofstream(flags.get("json")) << out.dump(2) << "\n";
  return 0;
}

}  // namespace

int run_bench(const std::vector<std::string>& args) {
  const std::vector<std::string> rest(args.empty() ? args.end() : args.begin() + 1, args.end());
  if (!args.empty() && args[0] == "latency") return run_latency(rest);
  if (!args.empty() && args[0] == "serve") return run_bench_serve(rest);
  std::cerr << "usage: attnres bench latency [flags]   engine latency, no server\n"
               "       attnres bench serve [flags]     load a running server (vLLM's bench serve)\n"
               "(see attnres bench latency --help, attnres bench serve --help)\n";
  return 2;
}

}  // namespace attnres::cli
