#include "clients/cpp/cli/cli_options.h"

#include <charconv>
#include <cmath>

#include "engine/core/error.h"
#include "clients/cli_flags/sampling_flags.h"

namespace attnres::client::cli {
namespace {

using attnres::cli::Flags;
using attnres::cli::FlagSpec;

template <class T>
T parse_exact(const std::string& flag, const std::string& text, const char* expected) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end) {
    throw Error("--" + flag + ": expected " + expected + ", got '" + text + "'");
  }
  return value;
}

std::optional<float> optional_float(const Flags& flags, const std::string& name) {
  if (auto value = flags.get_optional_double(name)) return static_cast<float>(*value);
  return std::nullopt;
}

// --logit-bias ID:BIAS, repeatable; a later bias for the same id replaces the earlier one.
std::map<int32_t, float> logit_bias_from_flags(const Flags& flags) {
  std::map<int32_t, float> bias;
  for (const std::string& item : flags.get_all("logit-bias")) {
    const size_t colon = item.find(':');
    if (colon == std::string::npos) {
      throw Error("--logit-bias: expected ID:BIAS, got '" + item + "'");
    }
    const auto id = parse_exact<int32_t>("logit-bias", item.substr(0, colon), "ID:BIAS");
    bias[id] = parse_exact<float>("logit-bias", item.substr(colon + 1), "ID:BIAS");
  }
  return bias;
}

}  // namespace

std::vector<FlagSpec> connection_flags() {
  return {
      {"target", "HOST:PORT",
       std::string("the server's gRPC address (default: $") + kTargetEnv + ", else " +
           kDefaultTarget + ")"},
      {"api-key", "KEY",
       std::string("sent as 'authorization: Bearer KEY' (default: $") + kApiKeyEnv + ")"},
      {"timeout", "SECONDS", "deadline of the call, generation included (default: none)"},
      {"wait-for-ready", "",
       "wait for the server to come up (within --timeout) instead of "
       "failing at once with UNAVAILABLE"},
  };
}

std::vector<FlagSpec> generate_flags() {
  std::vector<FlagSpec> specs = {
      {"prompt", "TEXT", "the prompt, tokenized by the server"},
      {"prompt-ids", "IDS", "the prompt as comma-separated token ids instead of text"},
      {"no-special-tokens", "", "do not add the tokenizer's special tokens (e.g. BOS) to --prompt"},
      {"request-id", "ID", "the request's id (for `attnres-client abort`; default: the server's)"},
      {"no-stream", "", "ask for the whole result at the end instead of streamed chunks"},
      {"json", "",
       "print one JSON object at the end: request_id, choices (text, token_ids, "
       "finish_reason, stop_reason, usage, logprobs), usage"},
      {"quiet", "", "no summary line (finish reason, usage) on stderr"},
      {"n", "N", "choices to generate for the prompt (default 1)"},
      {"no-skip-special-tokens", "", "keep special tokens in the text"},
  };
  for (FlagSpec spec :
       attnres::cli::sampling_flags()) {  // those of `attnres generate`, the server's defaults
    if (spec.name == "max-tokens")
      spec.help = "tokens to generate at most (default: the server's, 16)";
    specs.push_back(std::move(spec));
  }
  return specs;
}

ClientOptions client_options_from_flags(const Flags& flags, const EnvLookup& env,
                                        double default_timeout_seconds) {
  auto from_env = [&env](const char* name) -> std::string {
    const char* value = env ? env(name) : nullptr;
    return value ? value : "";
  };
  ClientOptions options;
  options.target = flags.get("target", from_env(kTargetEnv));
  if (options.target.empty()) options.target = kDefaultTarget;
  options.api_key = flags.get("api-key", from_env(kApiKeyEnv));
  const double timeout = flags.get_double("timeout", default_timeout_seconds);
  if (!std::isfinite(timeout) || timeout < 0) {
    throw Error("--timeout: expected seconds >= 0, got '" + flags.get("timeout") + "'");
  }
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(std::ceil(timeout * 1000)));
  options.wait_for_ready = flags.has("wait-for-ready");
  return options;
}

GenerateOptions generate_options_from_flags(const Flags& flags) {
  GenerateOptions options;
  if (flags.has("prompt") == flags.has("prompt-ids")) {
    throw Error("give exactly one of --prompt TEXT and --prompt-ids IDS");
  }
  if (flags.has("prompt")) {
    options.prompt = flags.get("prompt");
    if (flags.has("no-special-tokens")) options.add_special_tokens = false;
  } else {
    if (flags.has("no-special-tokens")) {
      throw Error("--no-special-tokens applies to --prompt only (token ids are used as given)");
    }
    options.prompt = flags.get_int_list("prompt-ids");
  }
  options.request_id = flags.get("request-id");
  options.stream = !flags.has("no-stream");

  SamplingOptions& s = options.sampling;
  if (flags.has("max-tokens")) s.max_tokens = flags.get_int("max-tokens", 0);
  s.temperature = optional_float(flags, "temperature");
  s.top_p = optional_float(flags, "top-p");
  s.top_k = flags.get_optional_int("top-k");
  s.min_p = optional_float(flags, "min-p");
  s.repetition_penalty = optional_float(flags, "repetition-penalty");
  s.presence_penalty = static_cast<float>(flags.get_double("presence-penalty", 0));
  s.frequency_penalty = static_cast<float>(flags.get_double("frequency-penalty", 0));
  s.logit_bias = logit_bias_from_flags(flags);
  if (flags.has("seed")) {
    s.seed = parse_exact<uint64_t>("seed", flags.get("seed"), "an integer in [0, 2^64)");
  }
  s.stop = flags.get_all("stop");
  s.stop_token_ids = flags.get_int_list("stop-token-ids");
  s.ignore_eos = flags.has("ignore-eos");
  s.min_tokens = flags.get_int("min-tokens", 0);
  s.logprobs = flags.get_optional_int("logprobs");
  s.n = flags.get_int("n", 1);
  if (flags.has("no-skip-special-tokens")) s.skip_special_tokens = false;
  return options;
}

}  // namespace attnres::client::cli
