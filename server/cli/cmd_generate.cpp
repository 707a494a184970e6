// attnres generate: one prompt in, text out (streamed), or a JSON record with ids and
// logprobs for scripts and tests.
#include <iostream>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/sched/model_execution.h"
#include "engine/sched/offline_generator.h"
#include "server/cli/commands.h"

namespace attnres::cli {
namespace {

std::vector<FlagSpec> generate_flags() {
  std::vector<FlagSpec> specs = model_flags();
  std::vector<FlagSpec> own = {
      {"prompt", "TEXT", "the prompt (default: a short demo prompt)"},
      {"prompt-ids", "IDS", "the prompt as comma-separated token ids instead of text"},
      {"chat", "", "treat --prompt as a user message and apply the model's chat template"},
      {"system", "TEXT", "with --chat: a system message before the user message"},
      {"no-special-tokens", "", "do not add the tokenizer's special tokens (e.g. BOS)"},
      {"json", "", "print one JSON object: prompt_ids, token_ids, text, finish_reason, logprobs"},
  };
  specs.insert(specs.end(), own.begin(), own.end());
  for (const FlagSpec& s : sampling_flags()) specs.push_back(s);
  return specs;
}

std::vector<int32_t> prompt_ids_from_flags(const Flags& flags, const LoadedModel& model) {
  if (flags.has("prompt-ids")) {
    if (flags.has("prompt")) throw Error("give either --prompt or --prompt-ids, not both");
    return flags.get_int_list("prompt-ids");
  }
  std::string prompt = flags.get("prompt", "Attention residuals let each layer choose");
  bool add_special = !flags.has("no-special-tokens");
  if (flags.has("chat")) {
    if (!model.chat_template) throw Error(model.source + ": the model has no chat template");
    nlohmann::json messages = nlohmann::json::array();
    if (flags.has("system"))
      messages.push_back({{"role", "system"}, {"content", flags.get("system")}});
    messages.push_back({{"role", "user"}, {"content", prompt}});
    prompt = model.chat_template->apply(messages, true, model.tokenizer_config);
    add_special = false;  // the template writes the special tokens itself (as vLLM does)
  }
  return model.tokenizer->encode(prompt, add_special);
}

}  // namespace

int run_generate(const std::vector<std::string>& args) {
  const auto specs = generate_flags();
  if (print_help_if_asked(args, "generate", "Generate text from a prompt.", specs)) return 0;
  Flags flags(specs, args);
  LoadedModel model = load_model_from_flags(flags);
  SamplingParams params = sampling_from_flags(flags, model);
  const bool json = flags.has("json");
  if (json && params.logprobs < 0) params.logprobs = 0;  // the sampled token's logprob

  GenerationRequest request{prompt_ids_from_flags(flags, model), params};
  OfflineGeneratorOptions options;
  options.max_model_len = model.config.max_position_embeddings;
  OfflineGenerator::validate({request}, model.vocabulary(), options.max_model_len);
  options.num_kv_blocks = OfflineGenerator::blocks_needed({request}, options.block_size);
  const EngineArgs engine_args = engine_args_from_flags(flags);
  options.device_sampling = engine_args.device_sampling;
  options.async_scheduling = engine_args.async_scheduling;
  auto exec = make_model_execution(engine_args, model, options.num_kv_blocks, options.block_size);
  OfflineGenerator generator(*exec->runner, model.tokenizer, model.eos_token_ids(), options);
  OfflineGenerator::TextCallback stream;
  if (!json) {
    stream = [](size_t, std::string_view delta) { std::cout << delta << std::flush; };
  }
  GenerationResult result = std::move(generator.generate({request}, stream).front());
  if (!json) {
    std::cout << "\n";
    if (!result.error.empty()) {
      std::cerr << "attnres generate: error: generation failed: " << result.error << "\n";
      return 1;
    }
    return 0;
  }
  nlohmann::json out = {{"model", model.source},
                        {"prompt_ids", request.prompt_ids},
                        {"token_ids", result.token_ids},
                        {"text", result.text},
                        {"finish_reason", finish_reason_name(result.finish_reason)}};
  if (!result.error.empty()) out["error"] = "generation failed: " + result.error;
  nlohmann::json logprobs = nlohmann::json::array();
  for (const TokenLogprob& lp : result.logprobs) {
    nlohmann::json top = nlohmann::json::array();
    for (const auto& [id, value] : lp.top) top.push_back({{"token_id", id}, {"logprob", value}});
    logprobs.push_back({{"token_id", lp.token_id}, {"logprob", lp.logprob}, {"top", top}});
  }
  out["logprobs"] = logprobs;
  // Replace invalid UTF-8 (a byte-level model can emit half a character) instead of throwing.
  std::cout << out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  return result.error.empty() ? 0 : 1;
}

}  // namespace attnres::cli
