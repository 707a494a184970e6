#include "engine/sample/sampler.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/sample/bad_words.h"
#include "engine/sample/sample_row.h"

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
  block_bad_words(logits, params_.bad_words, output_ids);
  apply_logit_bias(logits, params_.logit_bias);
  if (blocks_stop_ids(output_ids.size())) {
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

void Sampler::add_device_row(std::span<const int32_t> prompt_ids,
                             std::span<const int32_t> output_ids, std::span<const int32_t> eos_ids,
                             SampleBatch& batch) {
  // A constraint's bitmask is the caller's to add (SequenceOutput::add_device_row).
  ATTNRES_CHECK(can_sample_on_device(params_, /*token_masks=*/true),
                "a sequence that needs its logits on the host");
  std::vector<int32_t>& ids = batch.token_ids;
  auto append = [&](std::span<const int32_t> from, int32_t& begin, int32_t& count) {
    begin = static_cast<int32_t>(ids.size());
    count = static_cast<int32_t>(from.size());
    ids.insert(ids.end(), from.begin(), from.end());
  };
  SampleRow row;
  row.greedy = params_.greedy();
  row.temperature = params_.temperature;
  row.top_k = params_.top_k;
  row.top_p = params_.top_p;
  row.min_p = params_.min_p;
  row.repetition_penalty = params_.repetition_penalty;
  row.presence_penalty = params_.presence_penalty;
  row.frequency_penalty = params_.frequency_penalty;
  // Only the ids a processor reads travel (apply_penalties reads none when it is inactive, the
  // prompt only for a repetition penalty).
  if (params_.repetition_penalty != 1.0f) append(prompt_ids, row.prompt_begin, row.prompt_count);
  if (PenaltyParams{row.repetition_penalty, row.presence_penalty, row.frequency_penalty}.active()) {
    append(output_ids, row.output_begin, row.output_count);
  }
  if (blocks_stop_ids(output_ids.size())) {
    row.blocked_begin = static_cast<int32_t>(ids.size());
    ids.insert(ids.end(), eos_ids.begin(), eos_ids.end());
    ids.insert(ids.end(), params_.stop_token_ids.begin(), params_.stop_token_ids.end());
    row.blocked_count = static_cast<int32_t>(ids.size()) - row.blocked_begin;
  }
  if (!row.greedy) row.uniform = next_uniform();
  batch.rows.push_back(row);
}

}  // namespace attnres
