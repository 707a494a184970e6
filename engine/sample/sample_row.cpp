#include "engine/sample/sample_row.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "engine/core/error.h"
#include "engine/sample/token_bitmask.h"

namespace attnres {
namespace {

std::span<const int32_t> id_range(std::span<const int32_t> ids, int32_t begin, int32_t count,
                                  const char* what) {
  ATTNRES_CHECK(begin >= 0 && count >= 0 && static_cast<size_t>(begin) + count <= ids.size(),
                std::string("sample: ") + what + " ids [" + std::to_string(begin) + ", +" +
                    std::to_string(count) + ") outside the batch's " + std::to_string(ids.size()) +
                    " ids");
  return ids.subspan(static_cast<size_t>(begin), static_cast<size_t>(count));
}

}  // namespace

LogitsVerdict check_logits(std::span<const float> logits, int32_t decodable) {
  bool any_finite = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) {
      return {kSampleNonFiniteLogit, static_cast<int64_t>(i)};
    }
    any_finite = any_finite || (std::isfinite(x) && static_cast<int64_t>(i) < decodable);
  }
  return {any_finite ? 0 : kSampleNoDecodableLogit, -1};
}

bool can_sample_on_device(const SamplingParams& params, bool token_masks) {
  return params.logprobs < 0 && params.logit_bias.empty() && params.allowed_token_ids.empty() &&
         params.bad_words.empty() && (token_masks || !params.constraint);
}

int32_t sample_row(std::span<float> logits, const SampleRow& row,
                   std::span<const int32_t> token_ids, int32_t decodable, SampleRowScratch& scratch,
                   std::span<const int32_t> bitmask) {
  const auto prompt = id_range(token_ids, row.prompt_begin, row.prompt_count, "prompt");
  const auto output = id_range(token_ids, row.output_begin, row.output_count, "output");
  const auto blocked = id_range(token_ids, row.blocked_begin, row.blocked_count, "blocked");
  if (const int32_t bad = check_logits(logits, decodable).code; bad != 0) return bad;

  // The host's order: padding mask, the constraint's mask (SequenceOutput::next), then
  // Sampler::sample.
  const size_t first_padding = std::min(logits.size(), static_cast<size_t>(std::max(decodable, 0)));
  std::fill(logits.begin() + static_cast<std::ptrdiff_t>(first_padding), logits.end(),
            -std::numeric_limits<float>::infinity());
  if (!bitmask.empty()) apply_token_bitmask(logits, bitmask);
  block_tokens(logits, blocked);
  apply_penalties(logits, prompt, output,
                  {row.repetition_penalty, row.presence_penalty, row.frequency_penalty},
                  scratch.penalties);
  if (row.greedy) return argmax(logits);
  apply_temperature(logits, row.temperature);
  if (*std::max_element(logits.begin(), logits.end()) == -std::numeric_limits<float>::infinity()) {
    return kSampleEveryLogitMasked;  // TruncatedDistribution::build would throw
  }
  scratch.distribution.build(logits, {row.top_k, row.top_p, row.min_p});
  return scratch.distribution.sample(row.uniform);
}

}  // namespace attnres
