// Response bodies in the OpenAI shapes: completions ("text_completion"), chat
// ("chat.completion"), their streamed chunks, usage and the two logprobs formats.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/core/depth_attention.h"
#include "engine/sched/request_stream.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/common/choice_result.h"

namespace attnres::server::http {

using Json = nlohmann::ordered_json;

// The fields every body and chunk starts with.
struct ResponseHead {
  std::string id;      // cmpl-... / chatcmpl-...
  std::string object;  // text_completion, chat.completion, chat.completion.chunk
  int64_t created = 0;
  std::string model;
};
Json head_json(const ResponseHead& head);

Json usage_json(const Usage& usage);
// "stop" / "length" / "abort", or null while running.
Json finish_reason_json(FinishReason reason);
// vLLM's stop_reason: the stop string, the stop token id, or null.
Json stop_reason_json(const std::optional<std::string>& stop_string,
                      const std::optional<int32_t>& stop_token);

// Completions logprobs {tokens, token_logprobs, top_logprobs, text_offset} for `logprobs`;
// `text_offset` is where the first token's text starts in the choice text and is advanced
// past the tokens (so streamed chunks continue the count).
Json completion_logprobs_json(const Tokenizer& tokenizer, std::span<const TokenLogprob> logprobs,
                              size_t& text_offset);
// The same, starting with the echoed prompt's positions (echo with logprobs, as OpenAI's legacy
// completions): prompt_logprobs[i] is prompt_ids[i]'s (null, at position 0, gives null
// token_logprobs and top_logprobs entries), then the generated tokens' `logprobs`.
Json completion_logprobs_json(const Tokenizer& tokenizer, std::span<const int32_t> prompt_ids,
                              std::span<const std::optional<TokenLogprob>> prompt_logprobs,
                              std::span<const TokenLogprob> logprobs, size_t& text_offset);
// vLLM's prompt_logprobs: one entry per prompt token, null for the first (nothing conditions
// it); each an object keyed by token id (a string) with {"logprob", "rank", "decoded_token"}
// for the prompt's own token, then the top k at that position.
Json prompt_logprobs_json(const Tokenizer& tokenizer, std::span<const int32_t> prompt_ids,
                          std::span<const std::optional<TokenLogprob>> prompt_logprobs);
// A choice's depth-attention weights (request field return_depth_attention, docs/ATTNRES.md §5):
// {"sublayers": [row labels], "sources": [column labels], "prompt_mean": [[...]],
//  "per_token": [[[...]], ...]}, each matrix a list of rows, null in the cells a sublayer does
// not have. The labels and prompt_mean are present when prompt_mean is given (non-streamed, or
// a choice's first streamed chunk); per_token when it is given (one matrix per token).
Json depth_attention_json(const DepthAttentionLayout& layout,
                          const DepthAttentionMatrix* prompt_mean,
                          const std::vector<DepthAttentionMatrix>* per_token);
// Whether an output carries depth-attention weights to send.
bool has_depth_attention(const RequestOutput& out);

// Chat logprobs {content: [{token, logprob, bytes, top_logprobs: [...]}]}.
Json chat_logprobs_json(const Tokenizer& tokenizer, std::span<const TokenLogprob> logprobs);

}  // namespace attnres::server::http
