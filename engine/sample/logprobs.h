// Log-probabilities reported to clients. Like vLLM's default (logprobs_mode = raw_logprobs)
// they come from the model's unprocessed logits, not from the penalised / truncated ones.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace attnres {

struct TokenLogprob {
  int32_t token_id = -1;
  float logprob = 0.0f;
  int rank = 0;  // 1-based; vLLM's rule: the number of tokens whose logprob is >= the chosen one
  std::vector<std::pair<int32_t, float>> top;  // the top k (token, logprob), best first
};

// log_softmax of `raw_logits` evaluated at `chosen`, plus its rank and the top `top_k` tokens
// (ties by lowest id). Max-shifted and summed in double, so large logits do not overflow.
// The softmax is over every row (the model's own distribution, as transformers computes it);
// the top tokens are chosen among ids [0, candidates) only (-1: every id), so that padding
// rows with no text are never reported as alternatives.
TokenLogprob compute_logprobs(std::span<const float> raw_logits, int32_t chosen, int top_k,
                              int candidates = -1);

}  // namespace attnres
