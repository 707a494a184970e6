// Turns one sequence's logits into its next token: vLLM's processing order (allowed_token_ids,
// bad_words, logit_bias, min_tokens blocking, penalties, temperature, top-k, top-p, min-p) then an
// inverse-CDF draw.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "engine/core/backend.h"
#include "engine/sample/logits_processors.h"
#include "engine/sample/logprobs.h"
#include "engine/sample/sampling_params.h"
#include "engine/sample/truncated_distribution.h"

namespace attnres {

// One per sequence. It owns the RNG, so a seeded request draws the same tokens however it is
// batched, and scratch buffers reused across steps (no per-token vocabulary allocations).
class Sampler {
 public:
  // fallback_seed seeds the RNG when params.seed is unset (the server picks it per request).
  Sampler(const SamplingParams& params, uint64_t fallback_seed);

  // logits: the model's raw logits for this sequence [vocab] (modified in place as scratch).
  // prompt_ids / output_ids: for the penalties. eos_ids (with params.stop_token_ids) are
  // blocked while output_ids.size() < min_tokens.
  // logprob_out: filled when params.logprobs >= 0 (from the raw logits); may be null.
  int32_t sample(std::span<float> logits, std::span<const int32_t> prompt_ids,
                 std::span<const int32_t> output_ids, std::span<const int32_t> eos_ids,
                 TokenLogprob* logprob_out);

  // Device sampling (Backend::sample; requires can_sample_on_device(params), sample_row.h):
  // appends to `batch` the row that makes the backend pick what sample() would for these ids,
  // and draws its uniform now, exactly as sample() would (random sampling only: a greedy row
  // draws nothing), so the sequence's RNG advances the same on either path.
  void add_device_row(std::span<const int32_t> prompt_ids, std::span<const int32_t> output_ids,
                      std::span<const int32_t> eos_ids, SampleBatch& batch);

  const SamplingParams& params() const { return params_; }

  // Uniform in [0, 1) from the top 53 bits: unlike std::uniform_real_distribution, whose
  // algorithm the standard leaves open, this gives the same draw on every platform. One per
  // randomly sampled token, on either path.
  double next_uniform();

 private:
  bool blocks_stop_ids(size_t num_output) const {
    return num_output < static_cast<size_t>(std::max(params_.min_tokens, 0));
  }

  SamplingParams params_;
  std::mt19937_64 rng_;
  PenaltyScratch penalty_scratch_;
  TruncatedDistribution distribution_;
  std::vector<float> allowed_scratch_;
  std::vector<float> raw_logits_;  // copy kept for logprobs, which use the unprocessed logits
};

}  // namespace attnres
