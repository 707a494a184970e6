#include "engine/sample/sampler.h"

#include <algorithm>

namespace attnres {

Sampler::Sampler(const SamplingParams& params, uint64_t fallback_seed)
    : params_(params), rng_(params.seed.value_or(fallback_seed)) {}

double Sampler::next_uniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int32_t Sampler::sample(std::span<float> logits, std::span<const int32_t> prompt_ids,
                        std::span<const int32_t> output_ids, std::span<const int32_t> eos_ids,
                        TokenLogprob* logprob_out) {
  const bool want_logprobs = params_.logprobs >= 0 && logprob_out != nullptr;
  if (want_logprobs) raw_logits_.assign(logits.begin(), logits.end());

  allow_only(logits, params_.allowed_token_ids, allowed_scratch_);
  apply_logit_bias(logits, params_.logit_bias);
  if (output_ids.size() < static_cast<size_t>(std::max(params_.min_tokens, 0))) {
    block_tokens(logits, eos_ids);
    block_tokens(logits, params_.stop_token_ids);
  }
  apply_penalties(logits, prompt_ids, output_ids,
                  {params_.repetition_penalty, params_.presence_penalty, params_.frequency_penalty},
                  penalty_scratch_);

  int32_t token;
  if (params_.greedy()) {
    token = argmax(logits);  // single pass; truncation cannot change the argmax
  } else {
    apply_temperature(logits, params_.temperature);
    distribution_.build(logits, {params_.top_k, params_.top_p, params_.min_p});
    token = distribution_.sample(next_uniform());
  }

  if (want_logprobs) *logprob_out = compute_logprobs(raw_logits_, token, params_.logprobs);
  return token;
}

}  // namespace attnres
