// OpenAI / vLLM request bodies -> what the engine runs. Each field is checked on its own (wrong
// type or out of range: a 400 naming it); fields left out take ServerState::default_sampling()
// (the model's generation_config.json), as vLLM does.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/sample/sampling_params.h"
#include "server/common/chat_answer.h"
#include "server/common/server_state.h"

namespace attnres::server::http {

// One prompt of a request, tokenized.
struct PromptInput {
  std::vector<int32_t> ids;
  std::string text;  // what echo prepends: the prompt string, or the ids decoded
};

// What /v1/completions and /v1/chat/completions have in common once parsed.
struct GenerationOptions {
  SamplingParams params;
  int n = 1;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // stream_options.continuous_usage_stats (vLLM; with include_usage): usage in every chunk.
  bool continuous_usage = false;
  bool return_token_ids = false;  // vLLM: choices carry token_ids, plus prompt_token_ids
};

struct CompletionRequest {
  std::vector<PromptInput> prompts;  // one choice set of n per prompt
  GenerationOptions options;
  bool echo = false;
};

struct ChatRequest {
  PromptInput prompt;  // the rendered conversation
  GenerationOptions options;
  bool logprobs = false;  // chat: bool + top_logprobs
  int top_logprobs = 0;
  ChatAnswerFormat answer_format;  // how the answer splits into reasoning, content, tool calls
  bool include_reasoning = true;   // vLLM's include_reasoning: false drops the reasoning
};

// A present "model" must be the served name (404 model_not_found otherwise).
void check_model_field(const nlohmann::ordered_json& body, const ServerState& state);

CompletionRequest parse_completion_request(const nlohmann::ordered_json& body,
                                           const ServerState& state);
ChatRequest parse_chat_request(const nlohmann::ordered_json& body, const ServerState& state);

// 400 with OpenAI's wording when prompt + max_tokens exceeds max_model_len. `what` names the
// prompt ("messages" for chat, "prompt" for completions).
void check_context_length(int prompt_tokens, int max_tokens, int max_model_len, const char* what);

}  // namespace attnres::server::http
