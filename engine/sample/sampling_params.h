// Per-request sampling parameters, in the vocabulary of the OpenAI / vLLM request fields the
// server maps onto them (docs/ARCHITECTURE.md, request path; the API: ../shared/design/API.md), and
// their validation.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/sample/output_constraint.h"
#include "engine/sample/vocabulary.h"

namespace attnres {

struct SamplingParams {
  float temperature = 1.0f;  // 0 (below kGreedyTemperature) => greedy
  float top_p = 1.0f;
  int top_k = 0;  // 0 or -1: off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // (token id, bias added to its logit)
  // vLLM's allowed_token_ids: when non-empty, only these ids can be sampled (logprobs still
  // describe the model's own distribution, as vLLM reports them).
  std::vector<int32_t> allowed_token_ids;
  // vLLM's bad_words, tokenized: token-id sequences that must never appear in the output
  // (block_bad_words, bad_words.h). Each non-empty.
  std::vector<std::vector<int32_t>> bad_words;
  std::optional<uint64_t> seed;
  int max_tokens = 16;
  int min_tokens = 0;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  // vLLM's include_stop_str_in_output: the stop string that ended the output stays in its text
  // (and the text is not held back while a stop string may be forming); a stop token's text
  // stays too.
  bool include_stop_str_in_output = false;
  int logprobs = -1;  // -1: none; k >= 0: the sampled token's logprob plus the top k
  // vLLM's prompt_logprobs. -1: none; k >= 0: every prompt token's logprob under the model
  // (position 0 has none) plus the top k there, reported once per request.
  int prompt_logprobs = -1;
  bool skip_special_tokens = true;
  // Depth-attention introspection (docs/ATTNRES.md §5; models with depth mixes only): the
  // depth-mix weights averaged over the prompt, sent with each choice's first output; with
  // depth_attention_per_token (which implies depth_attention) also, with each generated
  // token, the weights of the forward that produced it (the position before it).
  bool depth_attention = false;
  bool depth_attention_per_token = false;
  // Structured output (response_format, structured_outputs, guided_*, grammar, json_schema):
  // every generated token must keep the text a prefix of a match; unset = unconstrained.
  std::optional<OutputConstraint> constraint;

  bool wants_depth_attention() const { return depth_attention || depth_attention_per_token; }

  // Throws attnres::Error "field X: got Y, expected Z" for the first invalid field; token ids
  // (logit_bias, allowed_token_ids, stop_token_ids, bad_words) must be ids the tokenizer can
  // decode.
  void validate(const Vocabulary& vocabulary) const;

  bool greedy() const;
};

// vLLM's _SAMPLING_EPS: temperatures below this sample greedily.
inline constexpr float kGreedyTemperature = 1e-5f;

// Validation limits, public so the server can quote them in its own messages and docs.
inline constexpr float kMaxTemperature = 100.0f;  // OpenAI caps at 2; vLLM has no cap
inline constexpr float kMaxRepetitionPenalty = 100.0f;
inline constexpr float kMaxPresenceFrequencyPenalty = 2.0f;  // OpenAI / vLLM: [-2, 2]
inline constexpr float kMaxLogitBias = 100.0f;               // OpenAI: [-100, 100]
inline constexpr int kMaxLogprobs = 20;                      // vLLM's default max_logprobs
inline constexpr size_t kMaxStopStrings = 16;
inline constexpr size_t kMaxAllowedTokenIds = 1 << 20;
inline constexpr size_t kMaxBadWordTokenIds = 1 << 16;  // all bad words' ids together

}  // namespace attnres
