// attnres bench serve: load a running server (ours or any OpenAI-compatible one) with random
// prompts of exact token lengths and report vLLM's serving metrics. The flags, the printed
// table, the metric definitions and the result JSON follow `vllm bench serve`
// (vllm/benchmarks/serve.py; clients/bench/ says which part follows which function). The work
// is in clients/bench (attnres_bench); this file only reads flags and wires the parts up.
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "clients/bench/metrics.h"
#include "clients/bench/progress_bar.h"
#include "clients/bench/prompt_dataset.h"
#include "clients/bench/report.h"
#include "clients/bench/runner.h"
#include "engine/core/error.h"
#include "server/cli/commands.h"
#ifdef ATTNRES_HAVE_BENCH_HTTP
#include "clients/bench/http_backend.h"
#endif
#ifdef ATTNRES_HAVE_BENCH_GRPC
#include "clients/bench/grpc_backend.h"
#endif

namespace attnres::cli {
namespace {

using namespace attnres::bench;

std::vector<FlagSpec> serve_bench_flags() {
  return {
      {"backend", "openai|openai-chat|grpc",
       "openai: /v1/completions; openai-chat: /v1/chat/completions; grpc: attnres.v1.Generate "
       "(default openai)"},
      {"url", "URL",
       "server address: http://HOST:PORT for openai*, HOST:PORT for grpc (default from --host and "
       "--port)"},
      {"base-url", "URL", "same as --url (vLLM's name)"},
      {"host", "HOST", "server host when --url is not given (default 127.0.0.1)"},
      {"port", "PORT", "server port when --url is not given (default 8000; grpc 50051)"},
      {"endpoint", "PATH", "HTTP route (default /v1/completions or /v1/chat/completions)"},
      {"model", "NAME", "model name sent with requests (default: the first of /v1/models)"},
      {"api-key", "KEY", "sent as Authorization: Bearer KEY (default $OPENAI_API_KEY)"},
      {"dataset-name", "random", "the data set; only random (vLLM's default) is supported"},
      {"num-prompts", "N", "requests to send (default 1000)"},
      {"random-input-len", "N",
       "prompt tokens as the server counts them, chat template included (default 1024)"},
      {"input-len", "N", "same as --random-input-len"},
      {"random-prefix-len", "N",
       "every prompt starts with the same N random tokens, then its own --random-input-len "
       "(vLLM's shared prefix; multi-turn: turn 1 only) (default 0)"},
      {"multi-turn", "T",
       "chat conversations of T turns: --num-prompts conversations, turn k sent with the "
       "earlier turns and answers as history; reports TTFT per turn (default 1)"},
      {"random-output-len", "N", "max_tokens per request (default 128)"},
      {"output-len", "N", "same as --random-output-len"},
      {"request-rate", "R",
       "requests per second, arrivals drawn from a gamma process; inf sends all at once "
       "(default inf)"},
      {"burstiness", "B",
       "shape of the gamma inter-arrival times: 1 = Poisson, < 1 burstier, > 1 more regular "
       "(default 1)"},
      {"max-concurrency", "N", "requests in flight at most (default: unlimited)"},
      {"num-warmups", "N", "unmeasured requests before the run (default 0)"},
      {"seed", "N", "seed of the prompts and the arrival times (default 0)"},
      {"ignore-eos", "", "generate exactly the output length (the default for random prompts)"},
      {"no-ignore-eos", "", "let EOS end requests early"},
      {"temperature", "T", "sent with every request (default: the server's)"},
      {"top-p", "P", "sent with every request"},
      {"top-k", "K", "sent with every request"},
      {"min-p", "P", "sent with every request"},
      {"frequency-penalty", "X", "sent with every request"},
      {"presence-penalty", "X", "sent with every request"},
      {"repetition-penalty", "X", "sent with every request"},
      {"percentile-metrics", "LIST",
       "metrics to report: ttft,tpot,itl,e2el,client_queue_time,e2el_including_client_queue "
       "(default ttft,tpot,itl,e2el)"},
      {"metric-percentiles", "LIST", "percentiles reported besides mean and median (default 99)"},
      {"save-result", "", "write the result JSON (default name as vLLM's)"},
      {"save-detailed", "",
       "include per-request arrays (input_lens, output_lens, ttfts, itls, start_times, "
       "generated_texts)"},
      {"result-dir", "DIR", "directory for the result JSON"},
      {"result-filename", "FILE", "name of the result JSON (implies --save-result)"},
      {"result-file", "FILE", "same as --result-filename"},
      {"label", "TEXT", "result label (default: the backend)"},
      {"request-id-prefix", "TEXT", "request ids are PREFIX<i> (default bench-<random>-)"},
      {"request-timeout", "S", "a request still running after S seconds fails (default 600)"},
      {"progress", "", "show the progress bar even when stderr is not a terminal"},
      {"disable-tqdm", "", "never show the progress bar"},
  };
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string now_date() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

std::string random_request_prefix() {
  std::random_device device;
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", device());
  return std::string("bench-") + buf + "-";
}

std::unique_ptr<ServingBackend> make_backend(const std::string& name, const std::string& url,
                                             const std::string& endpoint,
                                             const std::string& api_key) {
  if (name == "openai" || name == "openai-chat") {
#ifdef ATTNRES_HAVE_BENCH_HTTP
    return make_http_backend(
        url, name == "openai" ? OpenAiApi::kCompletions : OpenAiApi::kChatCompletions, endpoint,
        api_key);
#else
    throw Error("--backend " + name + ": this build has no HTTP client (cpp-httplib missing)");
#endif
  }
  if (name == "grpc") {
#ifdef ATTNRES_HAVE_BENCH_GRPC
    return make_grpc_backend(url, api_key);
#else
    throw Error("--backend grpc: this build has no gRPC client (gRPC / protobuf missing)");
#endif
  }
  throw Error("--backend " + name + ": expected openai, openai-chat or grpc");
}

int int_flag(const Flags& flags, const std::string& name, const std::string& alias, int fallback) {
  if (flags.has(name) && flags.has(alias)) {
    throw Error("--" + name + " and --" + alias + " set the same value: give one");
  }
  return flags.has(alias) ? flags.get_int(alias, fallback) : flags.get_int(name, fallback);
}

}  // namespace

int run_bench_serve(const std::vector<std::string>& args) {
  const std::vector<FlagSpec> specs = serve_bench_flags();
  if (print_help_if_asked(
          args, "bench serve",
          "Serving benchmark against a running server, with vLLM's `vllm bench serve`\n"
          "methodology: random prompts of exact token lengths (counted by the server's\n"
          "tokenizer), Poisson / gamma or burst arrivals, a concurrency limit; prints\n"
          "vLLM's table (throughput; mean, median and percentiles of TTFT, TPOT, ITL and\n"
          "E2EL) and writes its result JSON. Plot results with clients/bench/plot_results.py.\n"
          "Prefix caching: --random-prefix-len (a shared prefix) and --multi-turn (chat\n"
          "conversations); the cached-token hit rate from usage is printed after the table.",
          specs)) {
    return 0;
  }
  Flags flags(specs, args);
  const std::string backend_name = flags.get("backend", "openai");
  if (flags.has("dataset-name") && flags.get("dataset-name") != "random") {
    throw Error("--dataset-name " + flags.get("dataset-name") + ": only random is supported");
  }
  if (flags.has("url") && flags.has("base-url")) throw Error("give --url or --base-url, not both");
  std::string url = flags.get("url", flags.get("base-url"));
  if (url.empty()) {
    const std::string host = flags.get("host", "127.0.0.1");
    const int port = flags.get_int("port", backend_name == "grpc" ? 50051 : 8000);
    url = (backend_name == "grpc" ? "" : "http://") + host + ":" + std::to_string(port);
  }
  std::string api_key = flags.get("api-key");
  if (api_key.empty()) {
    if (const char* env = std::getenv("OPENAI_API_KEY")) api_key = env;
  }
  if (flags.has("ignore-eos") && flags.has("no-ignore-eos")) {
    throw Error("--ignore-eos and --no-ignore-eos contradict each other");
  }

  DatasetOptions data;
  data.num_prompts = flags.get_int("num-prompts", 1000);
  data.input_len = int_flag(flags, "random-input-len", "input-len", 1024);
  data.output_len = int_flag(flags, "random-output-len", "output-len", 128);
  data.prefix_len = flags.get_int("random-prefix-len", 0);
  data.turns = flags.get_int("multi-turn", 1);
  const int seed = flags.get_int("seed", 0);
  if (seed < 0) throw Error("--seed must be >= 0");
  data.seed = static_cast<uint64_t>(seed);
  check_dataset_options(data);

  RunOptions run;
  run.request_rate = flags.get_double("request-rate", INFINITY);
  run.burstiness = flags.get_double("burstiness", 1.0);
  run.seed = data.seed;
  if (flags.has("max-concurrency")) run.max_concurrency = flags.get_int("max-concurrency", 0);
  run.num_warmups = flags.get_int("num-warmups", 0);
  run.turns = data.turns;
  run.progress = !flags.has("disable-tqdm") && (flags.has("progress") || isatty(STDERR_FILENO));
  check_run_options(run);  // before any request: a bad flag must not cost a built data set

  RequestSettings settings;
  settings.ignore_eos = !flags.has("no-ignore-eos");
  settings.timeout_s = flags.get_double("request-timeout", 600);
  if (!(settings.timeout_s > 0)) throw Error("--request-timeout must be > 0");
  settings.request_id_prefix = flags.get("request-id-prefix", random_request_prefix());
  SamplingOverrides& s = settings.sampling;
  s.temperature = flags.get_optional_double("temperature");
  s.top_p = flags.get_optional_double("top-p");
  s.top_k = flags.get_optional_int("top-k");
  s.min_p = flags.get_optional_double("min-p");
  s.frequency_penalty = flags.get_optional_double("frequency-penalty");
  s.presence_penalty = flags.get_optional_double("presence-penalty");
  s.repetition_penalty = flags.get_optional_double("repetition-penalty");

  ReportSettings report;
  report.backend = backend_name;
  report.label = flags.get("label");
  report.base_url = url;
  report.num_prompts = data.num_prompts;
  report.input_len = data.input_len;
  report.output_len = data.output_len;
  report.prefix_len = data.prefix_len;
  report.turns = data.turns;
  report.request_rate = run.request_rate;
  report.burstiness = run.burstiness;
  report.max_concurrency = run.max_concurrency;
  report.seed = data.seed;
  report.num_warmups = run.num_warmups;
  report.ignore_eos = settings.ignore_eos;
  report.percentile_metrics = split_list(flags.get("percentile-metrics", "ttft,tpot,itl,e2el"));
  for (const std::string& metric : report.percentile_metrics) {
    metric_values({}, metric);  // throws an Error naming the valid metrics for an unknown one
  }
  for (const std::string& p : split_list(flags.get("metric-percentiles", "99"))) {
    double value = -1;
    const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), value);
    if (ec != std::errc() || end != p.data() + p.size() || !(value >= 0 && value <= 100)) {
      throw Error("--metric-percentiles: '" + p + "' is not a number in [0, 100]");
    }
    report.metric_percentiles.push_back(value);
  }
  report.save_detailed = flags.has("save-detailed");
  if (flags.has("result-filename") && flags.has("result-file")) {
    throw Error("give --result-filename or --result-file, not both");
  }
  const std::string result_name = flags.get("result-filename", flags.get("result-file"));
  const bool save = flags.has("save-result") || !result_name.empty();

  std::unique_ptr<ServingBackend> backend =
      make_backend(backend_name, url, flags.get("endpoint"), api_key);
  if (flags.has("model")) {
    settings.model = flags.get("model");
    backend->check_model(settings.model);
  } else {
    std::cout << "Model not specified, fetching first model from server...\n";
    settings.model = backend->first_model();
    std::cout << "First model name: " << settings.model << "\n";
  }
  report.model_id = settings.model;

  const int total_prompts = data.num_prompts * data.turns;
  std::cout << "Building " << total_prompts << " prompts of " << data.input_len;
  if (data.prefix_len > 0) std::cout << " + " << data.prefix_len << " shared prefix";
  std::cout << " tokens (counted by the server's tokenizer"
            << (backend_name == "openai-chat" ? ", chat template included" : "") << ")";
  if (data.turns > 1) {
    std::cout << " for " << data.num_prompts << " conversations of " << data.turns << " turns";
  }
  std::cout << "...\n" << std::flush;
  const double build_start = steady_seconds();
  std::unique_ptr<PromptTokenizer> tokenizer = backend->tokenizer(settings);
  ProgressBar build_bar("prompts", total_prompts, run.progress);
  const std::vector<BenchPrompt> prompts =
      make_dataset(*tokenizer, data, [&](int) { build_bar.update(); });
  build_bar.close();
  std::printf("Built in %.2f s.\n", steady_seconds() - build_start);

  if (run.num_warmups > 0) std::cout << "Warming up with " << run.num_warmups << " requests...\n";
  std::cout << "Starting main benchmark run...\n";
  std::cout << "Traffic request rate: " << python_float_str(run.request_rate) << "\n";
  std::cout << "Burstiness factor: " << python_float_str(run.burstiness) << " ("
            << (run.burstiness == 1.0 ? "Poisson process" : "Gamma distribution") << ")\n";
  std::cout << "Maximum request concurrency: "
            << (run.max_concurrency ? std::to_string(*run.max_concurrency) : "None") << "\n"
            << std::flush;
  report.date = now_date();
  const RunResult result = run_benchmark(*backend, prompts, settings, run);
  if (result.warmup_failures > 0) {
    std::cout << "Warning: " << result.warmup_failures
              << " warm-up requests failed; the first: " << result.first_warmup_error << "\n";
  }

  const bool queue_metrics = run.max_concurrency.has_value();
  const BenchmarkMetrics metrics =
      calculate_metrics(result.outputs, result.duration_s, report.metric_percentiles, queue_metrics,
                        queue_metrics && !std::isinf(run.request_rate));
  if (metrics.failed > 0) {
    std::cout << "Failed requests during benchmark run detected (capping to 10):\n";
    int shown = 0;
    for (const RequestOutput& o : result.outputs) {
      if (o.success || shown == 10) continue;
      std::cout << "Error " << shown++ << ": " << o.error << "\n";
    }
  }
  print_result_table(std::cout, metrics, result.duration_s, report);
  std::cout << std::flush;

  if (save) {
    std::filesystem::path path =
        result_name.empty() ? default_result_filename(report) : result_name;
    if (flags.has("result-dir")) {
      std::filesystem::create_directories(flags.get("result-dir"));
      path = std::filesystem::path(flags.get("result-dir")) / path;
    }
    std::ofstream file(path);
    if (!file) throw Error("cannot write the result to " + path.string());
    file << result_json(metrics, result, report).dump() << "\n";
    std::cout << "Result written to " << path.string() << "\n";
  }
  if (metrics.completed == 0) {
    std::cerr << "attnres bench serve: every request failed; the first error: "
              << result.outputs[0].error << "\n";
    return 1;
  }
  return 0;
}

}  // namespace attnres::cli
