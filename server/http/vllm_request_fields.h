// vLLM's request fields beyond OpenAI's that shape the prompt or the output, read with vLLM's
// rules: prompt_logprobs, bad_words, include_stop_str_in_output, truncate_prompt_tokens with
// truncation_side, the stream_options-needs-stream check, and chat's chat_template,
// chat_template_kwargs, documents, add_generation_prompt, continue_final_message and
// add_special_tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/http/field_reader.h"
#include "server/http/openai_requests.h"

namespace attnres::server::http {

// prompt_logprobs (not with stream, as vLLM), bad_words (tokenized here),
// include_stop_str_in_output; stream_options (include_usage, continuous_usage_stats) where
// stream_options without "stream": true is a 400 (vLLM's rule).
// `o.stream` must be read already.
void read_vllm_output_fields(const FieldReader& f, GenerationOptions& o,
                             const Tokenizer& tokenizer);

// vLLM's SamplingParams.update_from_tokenizer: each word as written (leading spaces dropped)
// and, when that is a different first token of the same length, with one leading space (a
// word in the middle of text), so both spellings are blocked. A word that is empty after that
// is a 400.
std::vector<std::vector<int32_t>> tokenize_bad_words(const std::vector<std::string>& words,
                                                     const Tokenizer& tokenizer);

// truncate_prompt_tokens: absent, -1 (as many as fit: max_model_len - max_tokens) or k >= 0
// (keep k tokens); truncation_side "left" (the default: keep the last k, as vLLM's tokenizers
// truncate) or "right" (keep the first k).
struct PromptTruncation {
  std::optional<int64_t> keep;
  bool keep_last = true;
};
PromptTruncation read_prompt_truncation(const FieldReader& f);

// Applies it to a prompt's ids. `max_tokens`: the output tokens asked for (0 when the request
// leaves it to the room left). A keep over max_model_len - max_tokens is a 400, as in vLLM.
// Returns whether ids changed.
bool truncate_prompt(std::vector<int32_t>& ids, const PromptTruncation& truncation,
                     int64_t max_tokens, int max_model_len);

// How a chat request's conversation becomes its prompt.
struct ChatPromptOptions {
  bool add_generation_prompt = true;
  // The final (assistant) message is left open for the model to continue. Both this and
  // add_generation_prompt set true is a 400 (vLLM); given alone it turns the default
  // add_generation_prompt off.
  bool continue_final_message = false;
  bool add_special_tokens = false;            // the template writes the ones it wants
  std::optional<ChatTemplate> chat_template;  // the request's own; a parse error is a 400
  // Extra template variables: chat_template_kwargs, and documents (a list, for templates
  // that take them, as transformers passes them).
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};
ChatPromptOptions read_chat_prompt_options(const FieldReader& f);

}  // namespace attnres::server::http
