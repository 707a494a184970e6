// attnres serve: the OpenAI-compatible HTTP server and the gRPC server over one
// continuous-batching engine. Startup: load the model, size the KV cache from the memory
// budget, start the engine thread, then the front ends. SIGINT / SIGTERM: stop accepting,
// let running requests finish within the grace period, abort the rest, exit 0. An engine
// that died (its forward failed: docs/ENGINE_CONTRACT.md) makes /health answer 503 and the
// process exit 1, so a supervisor restarts it.
#include <pthread.h>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include "engine/core/backend_registry.h"
#include "engine/core/error.h"
#include "engine/model/kv_cache.h"
#include "engine/parallel/process_group.h"
#include "engine/sched/engine_core.h"
#include "engine/sched/model_execution.h"
#include "server/cli/commands.h"
#include "server/cli/fault_injecting_runner.h"
#include "server/cli/scripted_reply_runner.h"
#include "server/common/metrics.h"
#include "server/common/server_state.h"
#include "server/http/http_limits.h"
#ifdef ATTNRES_HAVE_HTTP
#include "server/http/http_server.h"
#endif
#ifdef ATTNRES_HAVE_GRPC
#include "server/grpc/grpc_server.h"
#endif

namespace attnres::cli {
namespace {

std::vector<FlagSpec> serve_flags() {
  std::vector<FlagSpec> specs = model_flags();
  std::vector<FlagSpec> own = {
      {"host", "ADDR", "address both servers listen on (default 127.0.0.1)"},
      {"port", "N", "HTTP port (default 8000; 0 = any free port)"},
      {"grpc-port", "N", "gRPC port (default 50051; 0 = any free port)"},
      {"api-key", "KEY", "require Authorization: Bearer KEY (also ATTNRES_API_KEY)", true},
      {"served-model-name", "NAME", "the model name clients use (default: the model's folder)"},
      {"max-model-len", "N",
       "longest prompt + output in tokens (default: the model's, capped by "
       "the KV cache)"},
      {"max-num-seqs", "N", "sequences in the running batch at most (default 256)"},
      {"max-num-batched-tokens", "N", "tokens computed per engine step (default 2048)"},
      {"kv-cache-memory", "SIZE",
       "KV cache budget: bytes with a suffix (512MiB, 4GiB) or a fraction (0.2) of the "
       "memory the cache lives in: host RAM with --device cpu, the GPU's free memory "
       "before the weights load with --device cuda; per rank with --tensor-parallel-size. "
       "Default: 1GiB on the CPU; on a GPU 90% of its free memory less the weights and "
       "1GiB of working memory"},
      {"block-size", "N", "tokens per KV cache block (default 16)"},
      {"max-queued-requests", "N",
       "requests waiting beyond the running batch before 503 "
       "(default 1024)"},
      {"grace-period", "SECONDS", "on SIGTERM, time running requests get to finish (default 30)"},
      {"enable-prefix-caching", "",
       "reuse the KV cache of prompt prefixes computed before (the default; "
       "ATTNRES_ENABLE_PREFIX_CACHING=0 turns it off too)"},
      {"no-enable-prefix-caching", "", "turn automatic prefix caching off"},
      {"tool-call-parser", "NAME",
       "how chat answers' tool calls are written: hermes, llama3_json, mistral or none "
       "(default: what the chat template shows)"},
      {"enable-auto-tool-choice", "",
       "accepted for vLLM command lines: calls are always parsed when a tool-call parser is set "
       "or detected"},
      {"reasoning-parser", "NAME",
       "how chat answers' reasoning is marked: qwen3, deepseek_r1 or none (default: what the "
       "chat template shows)"},
      {"timeout-keep-alive", "SECONDS",
       "close an HTTP connection idle this long between requests (default 5)"},
      {"http-header-timeout", "SECONDS",
       "an HTTP request's headers must arrive within this of its first byte, else 408 (default "
       "10)"},
      {"no-ui", "", "do not serve the web playground at /"},
      {"http-max-connections", "N",
       "open HTTP connections at most; one more gets 503 (default 32768, lowered to fit "
       "the file-descriptor limit)"},
      {"max-stored-responses", "N",
       "/v1/responses kept for previous_response_id, least recently used evicted first "
       "(default 1024; 0 stores none)"},
  };
  specs.insert(specs.end(), own.begin(), own.end());
  return specs;
}

// --tool-call-parser / --reasoning-parser, or what the model's chat template shows.
void set_answer_parsers(const Flags& flags, const LoadedModel& model,
                        server::ServeOptions& options) {
  const std::string chat_template = model.tokenizer_config.chat_template.value_or("");
  options.tool_call_format = server::detect_tool_call_format(chat_template);
  if (flags.has("tool-call-parser")) {
    const auto format = server::tool_call_format_from_name(flags.get("tool-call-parser"));
    if (!format) {
      throw Error("--tool-call-parser: '" + flags.get("tool-call-parser") +
                  "' is not one of hermes, llama3_json, mistral, none");
    }
    options.tool_call_format = *format;
  }
  options.reasoning_format = server::detect_reasoning_format(chat_template);
  if (flags.has("reasoning-parser")) {
    const auto format = server::reasoning_format_from_name(flags.get("reasoning-parser"));
    if (!format) {
      throw Error("--reasoning-parser: '" + flags.get("reasoning-parser") +
                  "' is not one of qwen3, deepseek_r1, none");
    }
    options.reasoning_format = *format;
  }
  std::cerr << "attnres serve: chat answers: tool calls "
            << server::tool_call_format_name(options.tool_call_format) << ", reasoning "
            << server::reasoning_format_name(options.reasoning_format) << "\n";
}

std::chrono::milliseconds positive_seconds(const Flags& flags, const std::string& name,
                                           double fallback) {
  const double seconds = flags.get_double(name, fallback);
  if (!(seconds > 0) || seconds > 86400) {
    throw Error("--" + name + ": expected seconds in (0, 86400], got " + flags.get(name));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

server::http::HttpLimits http_limits_from_flags(const Flags& flags) {
  server::http::HttpLimits limits;
  limits.idle_timeout = positive_seconds(flags, "timeout-keep-alive", 5);
  limits.header_timeout = positive_seconds(flags, "http-header-timeout", 10);
  const int max_connections = flags.get_int("http-max-connections", 32768);
  if (max_connections < 1) throw Error("--http-max-connections: must be >= 1");
  limits.max_connections = static_cast<size_t>(max_connections);
  return limits;
}

// The bytes a fractional --kv-cache-memory is a fraction of: what the backend's traits say for
// each device a rank of this process uses (the smallest), host RAM for the CPU and the GPU's
// free memory for CUDA (BackendTraits::kv_memory_bytes). A process of an mpirun job sizes for
// its own device; the other processes' are assumed alike (they allocate what rank 0 sized).
size_t kv_fraction_base(const EngineArgs& args) {
  if (!has_backend(args.device)) return host_physical_memory_bytes();  // refused later, by name
  const BackendTraits traits = backend_traits(args.device);
  std::vector<int> devices;
  if (ProcessGroup* group = job_process_group()) {
    devices.push_back(group->local_rank());
  } else {
    for (int rank = 0; rank < std::max(1, args.tensor_parallel_size); ++rank)
      devices.push_back(rank);
  }
  size_t base = traits.kv_memory_bytes(devices.front());
  for (int device : devices) base = std::min(base, traits.kv_memory_bytes(device));
  return base;
}

// --kv-cache-memory left out: 1 GiB in host RAM; on a GPU, what its free memory holds after
// the weights, as vLLM's --gpu-memory-utilization 0.9 sizes it: 90% of the free memory, less
// the rank's share of the weights and 1 GiB for activations, workspaces and decode graphs.
size_t default_kv_cache_bytes(const EngineArgs& args, const LoadedModel& model) {
  constexpr size_t kGiB = size_t{1} << 30;
  if (args.device != "cuda" || !has_backend(args.device)) return kGiB;
  const double free = static_cast<double>(kv_fraction_base(args));
  const double weights = static_cast<double>(model.weights.total_bytes()) /
                         static_cast<double>(std::max(1, args.tensor_parallel_size));
  const double bytes = 0.9 * free - weights - static_cast<double>(kGiB);
  if (bytes < 64.0 * 1024 * 1024) {
    char message[256];
    std::snprintf(message, sizeof(message),
                  "the GPU's free memory (%.2f GiB) leaves no room for a KV cache after the "
                  "weights (%.2f GiB per rank) and 1 GiB of working memory: give "
                  "--kv-cache-memory",
                  free / kGiB, weights / kGiB);
    throw Error(message);
  }
  return static_cast<size_t>(bytes);
}

size_t parse_memory(const std::string& text, const EngineArgs& args) {
  if (text.empty()) throw Error("--kv-cache-memory: empty");
  size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    throw Error("--kv-cache-memory: '" + text + "' is not a size (e.g. 512MiB, 4GiB, 0.2)");
  }
  const std::string unit = text.substr(pos);
  if (unit.empty() && value > 0 && value <= 1) {
    try {
      return static_cast<size_t>(value * static_cast<double>(kv_fraction_base(args)));
    } catch (const Error& e) {
      throw Error("--kv-cache-memory " + text + " (a fraction of --device " + args.device +
                  "'s memory): " + e.what());
    }
  }
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  if (unit == "KiB" || unit == "K") scale = 1024.0;
  if (unit == "MiB" || unit == "M") scale = 1024.0 * 1024;
  if (unit == "GiB" || unit == "G") scale = 1024.0 * 1024 * 1024;
  if (scale == 0 || value <= 0) {
    throw Error("--kv-cache-memory: '" + text + "' is not a size (e.g. 512MiB, 4GiB, 0.2)");
  }
  return static_cast<size_t>(value * scale);
}

// On unless --no-enable-prefix-caching or ATTNRES_ENABLE_PREFIX_CACHING=0/false (a switch
// read from the environment is only ever "on", so the off value is read here).
bool prefix_caching_from_flags(const Flags& flags) {
  if (flags.has("enable-prefix-caching") && flags.has("no-enable-prefix-caching")) {
    throw Error("give --enable-prefix-caching or --no-enable-prefix-caching, not both");
  }
  if (flags.has("no-enable-prefix-caching")) return false;
  if (flags.has("enable-prefix-caching")) return true;
  const char* env = std::getenv(Flags::env_name("ATTNRES_", "enable-prefix-caching").c_str());
  const std::string value = env ? env : "";
  return !(value == "0" || value == "false");
}

std::string default_served_name(const LoadedModel& model) {
  if (model.source.rfind("built-in:", 0) == 0) return "attnres-" + model.source.substr(9);
  std::string dir = model.source;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const size_t slash = dir.find_last_of('/');
  return slash == std::string::npos ? dir : dir.substr(slash + 1);
}

// Signals are taken synchronously by the main thread (sigwait): blocked here, before any
// thread exists, so every thread (engine, OpenMP, front ends) inherits the mask.
sigset_t block_shutdown_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

}  // namespace

int run_serve(const std::vector<std::string>& args) {
  const auto specs = serve_flags();
  if (print_help_if_asked(args, "serve",
                          "Serve a model over the OpenAI-compatible HTTP API and gRPC.\n"
                          "Every flag can also be set as ATTNRES_<FLAG>, e.g. ATTNRES_PORT=8080.",
                          specs)) {
    return 0;
  }
  const sigset_t signals = block_shutdown_signals();
  Flags flags(specs, args, "ATTNRES_");

  EngineArgs engine_args = engine_args_from_flags(flags);
  const bool kv_memory_given = flags.has("kv-cache-memory");
  if (kv_memory_given) {
    engine_args.kv_cache_memory_bytes = parse_memory(flags.get("kv-cache-memory"), engine_args);
  }
  engine_args.block_size = flags.get_int("block-size", 16);
  if (flags.has("max-model-len")) engine_args.max_model_len = flags.get_int("max-model-len", 0);
  engine_args.max_num_seqs = flags.get_int("max-num-seqs", 256);
  engine_args.max_num_batched_tokens = flags.get_int("max-num-batched-tokens", 2048);
  engine_args.max_queued_requests = flags.get_int("max-queued-requests", 1024);
  engine_args.enable_prefix_caching = prefix_caching_from_flags(flags);

  LoadedModel model = load_model(engine_args);
  std::cerr << "attnres serve: loaded " << model.source << ": " << model.config.summary() << "\n";
  report_quantization(model);
  if (!kv_memory_given) {
    engine_args.kv_cache_memory_bytes = default_kv_cache_bytes(engine_args, model);
  }

  const EngineConfig engine_config = make_engine_config(engine_args, model);
  const int num_blocks = engine_config.num_kv_blocks;
  const int block_size = engine_config.block_size;
  const int64_t capacity_tokens = static_cast<int64_t>(num_blocks) * block_size;
  const int max_model_len = engine_config.scheduler.max_model_len;
  std::fprintf(stderr,
               "attnres serve: KV cache %d blocks x %d tokens = %lld tokens %s (%.1f MiB%s), "
               "max_model_len %d, prefix caching %s\n",
               num_blocks, block_size, static_cast<long long>(capacity_tokens),
               storage_dtype_name(kv_cache_dtype(engine_args, model)).c_str(),
               static_cast<double>(num_blocks) *
                   static_cast<double>(kv_bytes_per_block(engine_args, model, block_size)) /
                   (1024.0 * 1024.0),
               engine_args.tensor_parallel_size > 1 ? " per rank" : "", max_model_len,
               engine_config.enable_prefix_caching ? "on" : "off");
  if (model.config.attnres_mode != AttnResMode::None) {
    std::fprintf(stderr, "attnres serve: depth bank %s\n",
                 storage_dtype_name(depth_bank_dtype(engine_args, model)).c_str());
  }

  auto exec = make_model_execution(engine_args, model, num_blocks, block_size);
  exec->runner = FaultInjectingRunner::wrap_if_requested(std::move(exec->runner));
  exec->runner = ScriptedReplyRunner::wrap_if_requested(std::move(exec->runner), *model.tokenizer);
  std::cerr << "attnres serve: running on " << exec->description << "\n";
  EngineCore engine(engine_config, *exec->runner);
  std::cerr << "attnres serve: sampling "
            << (engine.samples_on_device()
                    ? "on the device (rows without logprobs, logit_bias or allowed_token_ids)"
                    : "on the host")
            << "\n";
  engine.start();

  server::ServeOptions options;
  options.host = flags.get("host", "127.0.0.1");
  options.http_port = flags.get_int("port", 8000);
  options.grpc_port = flags.get_int("grpc-port", 50051);
  options.api_keys = flags.get_all("api-key");  // also ATTNRES_API_KEY, like every flag
  options.served_model_name = flags.get("served-model-name", default_served_name(model));
  options.max_model_len = max_model_len;
  options.grace_period_seconds = flags.get_int("grace-period", 30);
  options.ui = !flags.has("no-ui");
  options.device = exec->description;
  if (options.grace_period_seconds < 0) throw Error("--grace-period: must be >= 0");
  const int max_stored_responses = flags.get_int("max-stored-responses", 1024);
  if (max_stored_responses < 0) throw Error("--max-stored-responses: must be >= 0");
  options.max_stored_responses = static_cast<size_t>(max_stored_responses);
  set_answer_parsers(flags, model, options);
  const server::http::HttpLimits http_limits = http_limits_from_flags(flags);
  server::Metrics metrics(options.served_model_name);
  server::ServerState state(model, engine, metrics, options);

  // gRPC first: once HTTP answers /health, both front ends are up.
#ifdef ATTNRES_HAVE_GRPC
  server::GrpcServer grpc(state);
  grpc.start();
  std::cerr << "attnres serve: gRPC on " << options.host << ":" << grpc.port() << "\n";
#else
  std::cerr << "attnres serve: built without the gRPC front end (gRPC/protobuf missing)\n";
#endif
#ifdef ATTNRES_HAVE_HTTP
  server::HttpServer http(state, http_limits);
  http.start();
  std::cerr << "attnres serve: HTTP (OpenAI API) on http://" << options.host << ":" << http.port()
            << "  model \"" << options.served_model_name << "\" (at most " << http.max_connections()
            << " connections)\n";
#else
  (void)http_limits;
  std::cerr << "attnres serve: built without the HTTP front end (Boost missing)\n";
#endif
  std::cerr << "attnres serve: ready" << std::endl;
#ifdef ATTNRES_HAVE_HTTP
  if (options.ui) {  // the last line: what a person opens
    const bool any = options.host == "0.0.0.0" || options.host == "::";
    std::cerr << "attnres serve: web playground: open http://" << (any ? "127.0.0.1" : options.host)
              << ":" << http.port() << "/ in a browser" << std::endl;
  }
#endif

  // Wait for a shutdown signal, or for the engine to die.
  int signal_number = 0;
  const timespec poll_interval{0, 200 * 1000 * 1000};
  while (signal_number <= 0) {
    signal_number = sigtimedwait(&signals, nullptr, &poll_interval);
    if (signal_number > 0) break;
    if (const EngineStats stats = engine.stats(); !stats.alive) {
      std::cerr << "attnres serve: error: the engine stopped after an error: " << stats.error
                << "\nattnres serve: exiting with status 1 so that a supervisor restarts the "
                   "server"
                << std::endl;
      break;
    }
    // Under mpirun: a rank that died or hangs while the engine is idle (a busy engine's step
    // fails with the same reason, and the engine dies above).
    if (const ProcessGroup* group = job_process_group(); group && !group->failure().empty()) {
      std::cerr << "attnres serve: error: tensor parallelism: " << group->failure()
                << "\nattnres serve: exiting with status 1 so that a supervisor restarts the "
                   "server"
                << std::endl;
      break;
    }
  }
  const bool engine_died = signal_number <= 0;
  if (!engine_died) {
    std::cerr << "attnres serve: " << (signal_number == SIGINT ? "SIGINT" : "SIGTERM")
              << ": draining (grace period " << options.grace_period_seconds << " s)" << std::endl;
  }
  state.stop_accepting();
#ifdef ATTNRES_HAVE_GRPC
  grpc.set_not_serving();
#endif
  // A dead engine has already ended every request with its error; the front ends get a
  // moment to deliver those before they stop.
  if (engine_died) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const bool drained = engine.shutdown(
      engine_died ? std::chrono::seconds(0) : std::chrono::seconds(options.grace_period_seconds));
#ifdef ATTNRES_HAVE_HTTP
  http.stop();
#endif
#ifdef ATTNRES_HAVE_GRPC
  grpc.stop();
#endif
  if (engine_died) return 1;
  std::cerr << "attnres serve: stopped"
            << (drained ? "" : " (requests still running at the deadline were aborted)") << "\n";
  return 0;
}

}  // namespace attnres::cli
