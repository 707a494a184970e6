// One row of Backend::sample (engine/core/backend.h) and the codes it writes for a row it
// refuses. Apart from backend.h so the CUDA kernels (C++17, no <span>) take the same struct.
#pragma once

#include <cstdint>

namespace attnres {

// Sampling on the device (Backend::sample): one row's parameters, exactly what the host
// Sampler (engine/sample/sampler.h) would apply to that row, in its order: padding rows masked,
// min_tokens blocking, penalties, then greedy argmax or temperature, top-k, top-p, min-p and an
// inverse-CDF draw at `uniform`. A structured-output row also has its token bitmask
// (bitmask_row), applied right after the padding mask as the host applies the constraint.
// logit_bias and allowed_token_ids are not here: rows that use them are sampled on the host
// (docs/ENGINE_CONTRACT.md, "Where sampling happens").
struct SampleRow {
  bool greedy = false;  // argmax after the penalties; the fields from temperature to uniform unused
  float temperature = 1.0f;
  int32_t top_k = 0;  // <= 0 or >= vocab: off
  float top_p = 1.0f;
  float min_p = 0.0f;
  // The sequence's own draw in [0, 1) (Sampler::next_uniform), taken on the host so that a
  // seed gives the same tokens on either path.
  double uniform = 0.0;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Ranges of SampleBatch::token_ids (repeats allowed, any order). Prompt ids are read only for
  // a repetition penalty, output ids only for a penalty; blocked ids (EOS and stop token ids
  // while the output is shorter than min_tokens) become -inf.
  int32_t prompt_begin = 0, prompt_count = 0;
  int32_t output_begin = 0, output_count = 0;
  int32_t blocked_begin = 0, blocked_count = 0;
  // Structured output: the row of SampleBatch::bitmask holding this row's allowed-token mask
  // (engine/sample/token_bitmask.h's layout); ids whose bit is clear become -inf. -1: none.
  int32_t bitmask_row = -1;
};

// What Backend::sample writes for a row the host path would refuse (the host's messages:
// check_logits_row, engine/sched/sequence_output.h; TruncatedDistribution::build).
inline constexpr int32_t kSampleNonFiniteLogit = -1;    // a NaN or +inf anywhere in the row
inline constexpr int32_t kSampleNoDecodableLogit = -2;  // no finite logit among the decodable ids
inline constexpr int32_t kSampleEveryLogitMasked = -3;  // random sampling with every logit -inf

}  // namespace attnres
