// The in-place logits transforms that run before truncation and sampling, in vLLM's order:
// logit_bias, min_tokens blocking, penalties, temperature. Each is O(touched tokens) except
// temperature, which is one pass over the vocabulary.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace attnres {

// Adds each bias to its token's logit (ids already validated against the vocabulary).
void apply_logit_bias(std::span<float> logits,
                      const std::vector<std::pair<int32_t, float>>& logit_bias);

// Sets the logits of `ids` to -inf so they cannot be sampled (min_tokens blocks EOS this way).
void block_tokens(std::span<float> logits, std::span<const int32_t> ids);

// vLLM's allowed_token_ids: every logit but those of `ids` becomes -inf (no-op when empty).
// `kept` is scratch reused across calls.
void allow_only(std::span<float> logits, std::span<const int32_t> ids, std::vector<float>& kept);

struct PenaltyParams {
  // Over prompt + output ids, once per distinct token: positive logits divided, negative ones
  // multiplied (so the token always becomes less likely).
  float repetition = 1.0f;
  float presence = 0.0f;   // subtracted once per distinct output token
  float frequency = 0.0f;  // subtracted once per occurrence in the output
  bool active() const { return repetition != 1.0f || presence != 0.0f || frequency != 0.0f; }
};

// Reusable per-sequence scratch so penalties cost O(prompt + output), not O(vocab) or a sort.
// Both vectors are all-zero between calls and sized to the vocabulary on first use.
struct PenaltyScratch {
  std::vector<uint8_t> seen;
  std::vector<int32_t> output_counts;
};

void apply_penalties(std::span<float> logits, std::span<const int32_t> prompt_ids,
                     std::span<const int32_t> output_ids, const PenaltyParams& penalties,
                     PenaltyScratch& scratch);

// Divides by the temperature (as vLLM does, rather than multiplying by its inverse, to match
// rounding) and turns NaN into -inf so the later sorts see a strict weak order.
void apply_temperature(std::span<float> logits, float temperature);

// Index of the largest logit, lowest id on ties (torch.argmax's rule); NaN never wins.
int32_t argmax(std::span<const float> logits);

}  // namespace attnres
