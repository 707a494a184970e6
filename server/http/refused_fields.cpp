#include "server/http/refused_fields.h"

#include <string>
#include <string_view>

#include "server/http/api_error.h"

namespace attnres::server::http {
namespace {

using Json = nlohmann::ordered_json;

// The values of a field that ask for nothing this server does not do (clients such as vLLM's
// send the defaults explicitly). `body` is the whole request, for fields judged against others.
using Harmless = bool (*)(const Json& value, const Json& body);

bool is_false(const Json& v, const Json&) { return v.is_boolean() && !v.get<bool>(); }
bool is_zero(const Json& v, const Json&) { return v.is_number() && v.get<double>() == 0.0; }
bool is_one(const Json& v, const Json&) { return v.is_number() && v.get<double>() == 1.0; }
bool is_minus_one(const Json& v, const Json&) { return v.is_number() && v.get<double>() == -1.0; }
bool is_not_positive(const Json& v, const Json&) { return v.is_number() && v.get<double>() <= 0; }
// best_of = n: the n samples are the answer; more would need server-side selection.
bool equals_n(const Json& v, const Json& body) {
  const auto n = body.find("n");
  const double want = n == body.end() || n->is_null() || !n->is_number() ? 1.0 : n->get<double>();
  return v.is_number() && v.get<double>() == want;
}
bool is_medium(const Json& v, const Json&) { return v == "medium"; }
bool is_text_only(const Json& v, const Json&) { return v == Json::array({"text"}); }

enum Where : unsigned { kCompletions = 1, kChat = 2, kBoth = 3 };

struct RefusedField {
  std::string_view name;
  unsigned where;       // Where bits
  Harmless harmless;    // nullptr: every non-null value is refused
  std::string_view ok;  // the harmless value, for the message ("" when none)
  std::string_view reason;
};

// One row per field. A field that starts working here loses its row.
constexpr RefusedField kRefused[] = {
    // ---- n-best and beam search ----
    {"use_beam_search", kBoth, is_false, "false", "beam search is not implemented"},
    {"best_of", kCompletions, equals_n, "equal to n",
     "choosing the best of more samples than n is not implemented"},
    // ---- prompt forms ----
    {"suffix", kCompletions, nullptr, "",
     "fill-in-the-middle is not supported (the model has no fill-in-the-middle tokens)"},
    {"prompt_embeds", kCompletions, nullptr, "", "prompt embeddings are not supported"},
    {"image_data", kBoth, nullptr, "", "the model takes text only"},
    {"echo", kChat, is_false, "false",
     "echoing the final message into the answer is not supported for chat"},
    // ---- constrained decoding ----
    {"guided_whitespace_pattern", kBoth, nullptr, "",
     "JSON output has one fixed layout: a whitespace pattern is not supported"},
    {"logits_processors", kBoth, nullptr, "", "custom logits processors are not supported"},
    // ---- tool calls ----
    {"functions", kChat, nullptr, "", "the deprecated functions field is not supported"},
    {"function_call", kChat, nullptr, "", "the deprecated function_call field is not supported"},
    // ---- reasoning ----
    {"reasoning_effort", kChat, nullptr, "", "reasoning effort is not supported"},
    {"thinking_token_budget", kBoth, is_minus_one, "-1",
     "a thinking-token budget is not supported"},
    // ---- output forms ----
    {"audio", kChat, nullptr, "", "audio output is not supported (a text model)"},
    {"modalities", kChat, is_text_only, "[\"text\"]", "the model writes text only"},
    {"web_search_options", kChat, nullptr, "", "web search is not supported"},
    {"verbosity", kChat, is_medium, "\"medium\"", "verbosity control is not supported"},
    {"logprob_token_ids", kBoth, nullptr, "",
     "logprobs of chosen token ids are not supported (logprobs gives the top ones)"},
    {"return_tokens_as_token_ids", kBoth, is_false, "false",
     "token_id:N logprob tokens are not supported (return_token_ids gives the ids)"},
    {"return_prompt_text", kChat, is_false, "false",
     "returning the rendered prompt is not supported (POST /tokenize renders it)"},
    // ---- engine features ----
    {"watermarking", kBoth, is_false, "false", "watermarking is not supported"},
    {"repetition_detection", kBoth, nullptr, "", "repetition detection is not supported"},
    {"priority", kBoth, is_zero, "0", "priority scheduling is not supported"},
    {"cache_salt", kBoth, nullptr, "", "salting the prefix cache is not supported"},
    {"kv_transfer_params", kBoth, nullptr, "", "disaggregated serving is not supported"},
    {"ec_transfer_params", kBoth, nullptr, "", "disaggregated serving is not supported"},
    // ---- llama.cpp's samplers and options ----
    {"n_predict", kBoth, is_minus_one, "-1", "llama.cpp's name for max_tokens: send max_tokens"},
    {"n_probs", kBoth, is_zero, "0", "llama.cpp's name for logprobs: send logprobs"},
    {"repeat_penalty", kBoth, is_one, "1",
     "llama.cpp's windowed repetition penalty is not supported (repetition_penalty is)"},
    {"penalize_nl", kBoth, is_false, "false", "newline penalties are not supported"},
    {"typical_p", kBoth, is_one, "1", "typical sampling is not supported"},
    {"tfs_z", kBoth, is_one, "1", "tail-free sampling is not supported"},
    {"mirostat", kBoth, is_zero, "0", "Mirostat sampling is not supported"},
    {"dynatemp_range", kBoth, is_zero, "0", "dynamic temperature is not supported"},
    {"dry_multiplier", kBoth, is_zero, "0", "DRY repetition penalties are not supported"},
    {"xtc_probability", kBoth, is_zero, "0", "XTC sampling is not supported"},
    {"top_n_sigma", kBoth, is_not_positive, "-1", "top-n-sigma sampling is not supported"},
    {"min_keep", kBoth, is_zero, "0", "a minimum candidate count is not supported"},
    {"samplers", kBoth, nullptr, "", "a custom sampler order is not supported"},
    {"post_sampling_probs", kBoth, is_false, "false",
     "post-sampling probabilities are not supported"},
    {"t_max_predict_ms", kBoth, is_not_positive, "0", "a generation time limit is not supported"},
    {"n_indent", kBoth, is_zero, "0", "a minimum line indentation is not supported"},
    {"lora", kBoth, nullptr, "", "LoRA adapters are not supported"},
    {"response_fields", kBoth, nullptr, "", "selecting response fields is not supported"},
    {"return_tokens", kBoth, is_false, "false",
     "llama.cpp's name for return_token_ids: send return_token_ids"},
};

// Accepted and ignored, because they cannot change what is generated or returned (vLLM ignores
// most of them the same way):
//   user, store, metadata, service_tier, prompt_cache_key, prompt_cache_retention,
//   safety_identifier (OpenAI account-side bookkeeping and routing); prediction (OpenAI's
//   predicted outputs only shorten latency); request_id, session_id (tracing and routing: the
//   response id stays the server's); stream_interval (how tokens are grouped into chunks);
//   stream_options.include_obfuscation (padding for the network); length_penalty,
//   early_stopping (beam search only, which is refused); spaces_between_special_tokens (vLLM
//   ignores it for fast tokenizers, the only kind served here); media_io_kwargs,
//   mm_processor_kwargs (multimodal inputs, which are refused); return_token_offsets,
//   return_mm_kwargs (vLLM's render endpoints only); routed_experts_prompt_start (MoE routing
//   data, which is never returned); vllm_xargs (arguments for vLLM plugins); llama.cpp's
//   cache_prompt, id_slot, n_keep, timings_per_token (caching, slots, context shift, timings)
//   and the parameters of its refused samplers (repeat_last_n, mirostat_tau, mirostat_eta,
//   dynatemp_exponent, dry_base, dry_allowed_length, dry_penalty_last_n,
//   dry_sequence_breakers, xtc_threshold), which do nothing while their sampler is off.

}  // namespace

void refuse_unsupported_fields(const Json& body, Endpoint endpoint) {
  if (!body.is_object()) return;  // FieldReader reports it
  const unsigned here = endpoint == Endpoint::Chat ? kChat : kCompletions;
  for (const RefusedField& field : kRefused) {
    if (!(field.where & here)) continue;
    const auto it = body.find(std::string(field.name));
    if (it == body.end() || it->is_null()) continue;
    if (field.harmless && field.harmless(*it, body)) continue;
    std::string message = "field ";
    message += field.name;
    message += ": ";
    message += field.reason;
    message += field.ok.empty() ? "; leave it out" : "; leave it out or send ";
    message += field.ok;
    throw bad_request(message, std::string(field.name));
  }
}

}  // namespace attnres::server::http
