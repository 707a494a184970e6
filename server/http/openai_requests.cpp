#include "server/http/openai_requests.h"

#include <algorithm>
#include <climits>

#include "engine/core/error.h"
#include "server/common/token_ids.h"
#include "server/http/api_error.h"
#include "server/http/chat_requests.h"
#include "server/http/chat_tools.h"
#include "server/http/field_reader.h"
#include "server/http/refused_fields.h"
#include "server/http/structured_output_fields.h"
#include "server/http/vllm_request_fields.h"

namespace attnres::server::http {
namespace {

constexpr int64_t kMaxChoices = 128;  // EngineConfig::max_choices' default

// Sampling fields both endpoints share, over `p` (which holds the defaults).
void read_sampling_fields(const FieldReader& f, SamplingParams& p) {
  if (auto v = f.number("temperature", 0.0, kMaxTemperature)) p.temperature = float(*v);
  if (auto v = f.number("top_p", 0.0, 1.0)) p.top_p = float(*v);
  if (auto v = f.integer("top_k", -1, INT32_MAX)) p.top_k = int(*v);
  if (auto v = f.number("min_p", 0.0, 1.0)) p.min_p = float(*v);
  if (auto v = f.number("presence_penalty", -2.0, 2.0)) p.presence_penalty = float(*v);
  if (auto v = f.number("frequency_penalty", -2.0, 2.0)) p.frequency_penalty = float(*v);
  if (auto v = f.number("repetition_penalty", 0.0, kMaxRepetitionPenalty)) {
    p.repetition_penalty = float(*v);
  }
  if (auto v = f.integer("seed", INT64_MIN, INT64_MAX)) p.seed = static_cast<uint64_t>(*v);
  if (auto v = f.integer("min_tokens", 0, INT32_MAX)) p.min_tokens = int(*v);
  if (auto v = f.string_or_list("stop")) p.stop = std::move(*v);
  if (auto v = f.int_list("stop_token_ids")) p.stop_token_ids = std::move(*v);
  if (auto v = f.int_list("allowed_token_ids")) {
    // vLLM refuses an empty list too: it would leave nothing to sample.
    if (v->empty()) {
      throw bad_request("field allowed_token_ids: is empty, expected at least one token id",
                        "allowed_token_ids");
    }
    p.allowed_token_ids = std::move(*v);
  }
  if (auto v = f.boolean("ignore_eos")) p.ignore_eos = *v;
  if (auto v = f.boolean("skip_special_tokens")) p.skip_special_tokens = *v;
  if (const auto* bias = f.find("logit_bias")) {
    if (!bias->is_object()) {
      throw bad_request(
          "field logit_bias: expected an object {\"token id\": bias}, got " + json_type_name(*bias),
          "logit_bias");
    }
    for (const auto& [key, value] : bias->items()) {
      std::string where = "logit_bias[\"";
      where += key;
      where += "\"]";
      int64_t id = 0;
      size_t used = 0;
      try {
        id = std::stoll(key, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != key.size()) {
        throw bad_request("field " + where + ": keys must be token ids written as strings",
                          "logit_bias");
      }
      if (!value.is_number()) {
        throw bad_request("field " + where + ": expected a number, got " + json_type_name(value),
                          "logit_bias");
      }
      if (id < INT32_MIN || id > INT32_MAX) {
        throw bad_request("field " + where + ": token id out of range", "logit_bias");
      }
      p.logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
    }
  }
}

// Depth-attention introspection (docs/ATTNRES.md §5): return_depth_attention gives each choice the
// depth-mix weights averaged over its prompt; depth_attention_per_token (which implies it)
// also the weights behind each generated token.
void read_depth_attention_fields(const FieldReader& f, SamplingParams& p,
                                 const ServerState& state) {
  if (auto v = f.boolean("return_depth_attention")) p.depth_attention = *v;
  if (auto v = f.boolean("depth_attention_per_token")) p.depth_attention_per_token = *v;
  if (p.depth_attention_per_token) p.depth_attention = true;
  if (p.depth_attention && state.engine().depth_attention_layout().empty()) {
    const char* field =
        f.has("return_depth_attention") ? "return_depth_attention" : "depth_attention_per_token";
    std::string message = "field ";
    message += field;
    message += ": the model `";
    message += state.options().served_model_name;
    message +=
        "` has no depth attention (it is not an AttnRes model), so there are no "
        "depth-attention weights to return";
    throw bad_request(message, field);
  }
}

void read_generation_options(const FieldReader& f, GenerationOptions& o, const ServerState& state) {
  read_sampling_fields(f, o.params);
  read_depth_attention_fields(f, o.params, state);
  read_structured_output_fields(f, o.params);
  if (auto v = f.integer("n", 1, kMaxChoices)) o.n = int(*v);
  if (auto v = f.boolean("stream")) o.stream = *v;
  if (auto v = f.boolean("return_token_ids")) o.return_token_ids = *v;
  read_vllm_output_fields(f, o, *state.model().tokenizer);
  f.string("user");  // accepted for OpenAI compatibility; only its type is checked
}

PromptInput prompt_from_ids(std::vector<int32_t> ids, const ServerState& state,
                            const std::string& field) {
  server::check_token_ids(field, ids, state.model().vocabulary());
  PromptInput prompt;
  prompt.text = state.model().tokenizer->decode(ids, /*skip_special_tokens=*/false);
  prompt.ids = std::move(ids);
  return prompt;
}

PromptInput prompt_from_text(std::string text, const ServerState& state, bool add_special_tokens) {
  PromptInput prompt;
  prompt.ids = state.model().tokenizer->encode(text, add_special_tokens);
  prompt.text = std::move(text);
  return prompt;
}

std::vector<int32_t> ids_of(const nlohmann::ordered_json& list, const std::string& where) {
  std::vector<int32_t> ids;
  ids.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    std::string at = where;
    at += '[';
    at += std::to_string(i);
    at += ']';
    ids.push_back(static_cast<int32_t>(json_integer(list[i], at, INT32_MIN, INT32_MAX)));
  }
  return ids;
}

// prompt: a string, a list of strings, a list of ids, or a list of id lists.
std::vector<PromptInput> read_prompts(const FieldReader& f, const ServerState& state,
                                      bool add_special_tokens) {
  const auto* prompt = f.find("prompt");
  if (!prompt) throw bad_request("field prompt: is required", "prompt");
  std::vector<PromptInput> prompts;
  if (prompt->is_string()) {
    prompts.push_back(prompt_from_text(prompt->get<std::string>(), state, add_special_tokens));
  } else if (prompt->is_array() && !prompt->empty()) {
    const auto& first = prompt->front();
    if (first.is_number()) {
      prompts.push_back(prompt_from_ids(ids_of(*prompt, "prompt"), state, "prompt"));
    } else {
      for (size_t i = 0; i < prompt->size(); ++i) {
        const auto& item = (*prompt)[i];
        std::string where = "prompt[";
        where += std::to_string(i);
        where += ']';
        if (item.is_string()) {
          prompts.push_back(prompt_from_text(item.get<std::string>(), state, add_special_tokens));
        } else if (item.is_array()) {
          prompts.push_back(prompt_from_ids(ids_of(item, where), state, "prompt"));
        } else {
          throw bad_request("field " + where + ": expected a string or a list of token ids, got " +
                                json_type_name(item),
                            "prompt");
        }
      }
    }
  } else {
    throw bad_request(
        "field prompt: expected a string, a list of strings, a list of token ids or a list of "
        "token-id lists, got " +
            (prompt->is_array() ? std::string("an empty list") : json_type_name(*prompt)),
        "prompt");
  }
  for (const PromptInput& p : prompts) {
    if (p.ids.empty())
      throw bad_request("field prompt: is empty, at least one token is needed", "prompt");
  }
  return prompts;
}

}  // namespace

void check_model_field(const nlohmann::ordered_json& body, const ServerState& state) {
  if (!body.is_object()) return;  // FieldReader reports it
  auto model = body.find("model");
  if (model == body.end() || model->is_null()) return;
  if (!model->is_string()) {
    throw bad_request("field model: expected a string, got " + json_type_name(*model), "model");
  }
  const std::string name = model->get<std::string>();
  if (name != state.options().served_model_name) {
    std::string message = "The model `";
    message += name;
    message += "` does not exist.";
    throw ApiError(404, message, "model", "model_not_found");
  }
}

void check_context_length(int prompt_tokens, int max_tokens, int max_model_len, const char* what) {
  const int64_t total = int64_t{prompt_tokens} + max_tokens;
  if (total <= max_model_len && prompt_tokens < max_model_len) return;
  std::string message = "This model's maximum context length is ";
  message += std::to_string(max_model_len);
  if (prompt_tokens >= max_model_len && max_tokens <= 0) {
    message += " tokens. However, your request has ";
    message += std::to_string(prompt_tokens);
    message += " input tokens. Please reduce the length of the input ";
    message += what;
    message += '.';
  } else {
    message += " tokens. However, you requested ";
    message += std::to_string(total);
    message += " tokens (";
    message += std::to_string(prompt_tokens);
    message += " in the ";
    message += what;
    message += ", ";
    message += std::to_string(max_tokens);
    message += " in the completion). Please reduce the length of the ";
    message += what;
    message += " or completion.";
  }
  throw bad_request(message, std::string(what) == "messages" ? "messages" : "prompt");
}

CompletionRequest parse_completion_request(const nlohmann::ordered_json& body,
                                           const ServerState& state) {
  FieldReader f(body);
  check_model_field(body, state);
  refuse_unsupported_fields(body, Endpoint::Completions);
  CompletionRequest request;
  GenerationOptions& o = request.options;
  o.params = state.default_sampling();
  o.params.max_tokens = 16;  // OpenAI's completions default
  read_generation_options(f, o, state);
  if (auto v = f.integer("max_tokens", 1, INT32_MAX)) o.params.max_tokens = int(*v);
  if (auto v = f.integer("logprobs", 0, kMaxLogprobs)) o.params.logprobs = int(*v);
  if (auto v = f.boolean("echo")) request.echo = *v;
  // echo with logprobs: the logprobs cover the echoed prompt too (vLLM's prompt_logprobs, which
  // an explicit prompt_logprobs overrides).
  if (request.echo && o.params.logprobs >= 0 && o.params.prompt_logprobs < 0) {
    o.params.prompt_logprobs = o.params.logprobs;
  }
  request.prompts = read_prompts(f, state, f.boolean("add_special_tokens").value_or(true));
  const PromptTruncation truncation = read_prompt_truncation(f);
  for (PromptInput& p : request.prompts) {
    if (truncate_prompt(p.ids, truncation, o.params.max_tokens, state.options().max_model_len)) {
      p.text = state.model().tokenizer->decode(p.ids, /*skip_special_tokens=*/false);
      if (p.ids.empty()) {
        throw bad_request("field truncate_prompt_tokens: leaves an empty prompt",
                          "truncate_prompt_tokens");
      }
    }
    check_context_length(int(p.ids.size()), o.params.max_tokens, state.options().max_model_len,
                         "prompt");
  }
  return request;
}

ChatRequest parse_chat_request(const nlohmann::ordered_json& body, const ServerState& state) {
  FieldReader f(body);
  check_model_field(body, state);
  refuse_unsupported_fields(body, Endpoint::Chat);
  ChatRequest request;
  GenerationOptions& o = request.options;
  o.params = state.default_sampling();
  read_generation_options(f, o, state);
  std::optional<int64_t> max_tokens = f.integer("max_tokens", 1, INT32_MAX);
  if (auto v = f.integer("max_completion_tokens", 1, INT32_MAX)) max_tokens = v;
  if (auto v = f.boolean("logprobs")) request.logprobs = *v;
  if (auto v = f.integer("top_logprobs", 0, kMaxLogprobs)) {
    if (!request.logprobs && *v > 0) {  // top_logprobs: 0 alone is harmless (some clients)
      throw bad_request("field top_logprobs: requires \"logprobs\": true", "top_logprobs");
    }
    request.top_logprobs = int(*v);
  }
  o.params.logprobs = request.logprobs ? request.top_logprobs : -1;

  const auto* messages = f.find("messages");
  if (!messages) throw bad_request("field messages: is required", "messages");
  const nlohmann::ordered_json normalized = normalize_messages(*messages);
  const ChatToolFields tool_fields = read_chat_tool_fields(f);
  const nlohmann::ordered_json tools = f.find("tools") ? *f.find("tools") : nullptr;
  const ChatPromptOptions prompt_options = read_chat_prompt_options(f);
  std::string text =
      render_chat_prompt(state.model(), normalized, prompt_options.add_generation_prompt, tools,
                         prompt_options.variables,
                         prompt_options.chat_template ? &*prompt_options.chat_template : nullptr);
  if (prompt_options.continue_final_message) text = cut_after_final_message(text, normalized);
  // The template already wrote the special tokens it wants (unless add_special_tokens).
  request.prompt.ids = state.model().tokenizer->encode(text, prompt_options.add_special_tokens);
  request.prompt.text = std::move(text);
  if (truncate_prompt(request.prompt.ids, read_prompt_truncation(f), max_tokens.value_or(0),
                      state.options().max_model_len)) {
    request.prompt.text =
        state.model().tokenizer->decode(request.prompt.ids, /*skip_special_tokens=*/false);
  }
  if (request.prompt.ids.empty()) {
    throw bad_request("field messages: the rendered conversation is empty", "messages");
  }
  apply_chat_tool_fields(tool_fields, state, request);
  const int prompt_tokens = int(request.prompt.ids.size());
  const int max_model_len = state.options().max_model_len;
  if (max_tokens) {
    o.params.max_tokens = int(*max_tokens);
    check_context_length(prompt_tokens, o.params.max_tokens, max_model_len, "messages");
  } else {
    // vLLM: whatever room the prompt leaves.
    check_context_length(prompt_tokens, 0, max_model_len, "messages");
    o.params.max_tokens = max_model_len - prompt_tokens;
  }
  if (o.params.min_tokens > o.params.max_tokens) {
    throw bad_request("field min_tokens: must not exceed max_tokens", "min_tokens");
  }
  return request;
}

}  // namespace attnres::server::http
