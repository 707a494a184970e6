// One row of Backend::sample (engine/core/backend.h) on the host: the host Sampler's pipeline
// (sampler.h) for a row described by a SampleRow, with the sequence's uniform given instead of
// drawn. The CPU backend's sample op runs it on its workers, so device sampling on the CPU is
// the host path bit for bit; the CUDA op is tested against it.
#pragma once

#include <cstdint>
#include <span>

#include "engine/core/backend.h"
#include "engine/sample/logits_processors.h"
#include "engine/sample/sampling_params.h"
#include "engine/sample/truncated_distribution.h"

namespace attnres {

// Whether a sequence's sampling rows can be sampled on the device. Not when the host needs
// the raw logits (logprobs), nor for the processors only the host applies (logit_bias,
// allowed_token_ids, bad_words): those rows' logits come back to the host as before. A
// structured-output constraint's token mask travels as a bitmask (SampleRow::bitmask_row)
// where the runner takes one (token_masks: ModelRunner::samples_masked_rows), else its rows
// stay on the host too.
bool can_sample_on_device(const SamplingParams& params, bool token_masks = false);

// The first reason a raw logits row cannot be sampled: kSampleNonFiniteLogit (a NaN or +inf;
// `at` is its id) or kSampleNoDecodableLogit (no finite logit among ids [0, decodable)); code 0
// when the row is fine. The host path (check_logits_row, engine/sched/sequence_output.h) turns
// it into its error, the device path into a code.
struct LogitsVerdict {
  int32_t code = 0;
  int64_t at = -1;
};
LogitsVerdict check_logits(std::span<const float> logits, int32_t decodable);

// Reused across rows by one thread: the penalties' marks (all zero between calls) and the
// truncated distribution's candidate list.
struct SampleRowScratch {
  PenaltyScratch penalties;
  TruncatedDistribution distribution;
};

// logits: the row [vocab], raw from the model; overwritten (scratch). token_ids: the batch's
// SampleBatch::token_ids. bitmask: the row's structured-output mask words (sample_row_bitmask,
// engine/core/sample_bitmask.h), empty when it has none. Returns the token the host Sampler
// picks (after check_logits_row's checks, the padding mask and the constraint's mask), or a
// kSample* code where the host path would throw.
int32_t sample_row(std::span<float> logits, const SampleRow& row,
                   std::span<const int32_t> token_ids, int32_t decodable, SampleRowScratch& scratch,
                   std::span<const int32_t> bitmask = {});

}  // namespace attnres
