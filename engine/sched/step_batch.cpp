#include "engine/sched/step_batch.h"

#include <algorithm>
#include <span>

#include "engine/sched/batch_builder.h"

namespace attnres {

StepPlan build_step_batch(const ScheduleOutput& schedule, int block_size,
                          const std::function<bool(const Sequence&)>& on_device) {
  StepPlan step;
  std::vector<int32_t> prompt_logit_rows;
  for (const ScheduledChunk& chunk : schedule.chunks) {
    Sequence& seq = *chunk.seq;
    const int first_token = seq.num_computed_tokens();
    const auto tokens = std::span(seq.token_ids)
                            .subspan(static_cast<size_t>(seq.num_computed_tokens()),
                                     static_cast<size_t>(chunk.num_new_tokens));
    const int32_t row = add_to_batch(step.batch.meta, seq.blocks, tokens, block_size);
    if (chunk.produces_logits) {
      int32_t depth_row = -1;
      if (seq.params.depth_attention_per_token) {
        depth_row = static_cast<int32_t>(step.batch.depth_rows.size());
        step.batch.depth_rows.push_back(row);
      }
      if (on_device && on_device(seq)) {
        step.batch.sample_rows.push_back(row);
        step.device_samplers.push_back(&seq);
        step.device_sampler_depth_row.push_back(depth_row);
      } else {
        step.batch.logit_rows.push_back(row);
        step.samplers.push_back(&seq);
        step.sampler_depth_row.push_back(depth_row);
      }
    }
    if (seq.needs_depth_prompt_rows()) {
      // Prompt positions [depth_prompt_end, num_prompt_tokens) that this chunk computes.
      const int begin = std::max(first_token, seq.depth_prompt_end);
      const int end = std::min(first_token + chunk.num_new_tokens, seq.num_prompt_tokens);
      if (begin < end) {
        const int32_t first_row = row - (chunk.num_new_tokens - 1);
        step.depth_prompt_rows.push_back(
            DepthPromptRows{&seq, begin, end - begin, step.batch.depth_rows.size()});
        for (int t = begin; t < end; ++t)
          step.batch.depth_rows.push_back(first_row + (t - first_token));
      }
    }
    if (seq.needs_prompt_logprob_rows()) {
      // The token at position t gives position t + 1's logprob: tokens in
      // [prompt_logprobs_end - 1, num_prompt_tokens - 1) that this chunk computes.
      const int begin = std::max(first_token, seq.prompt_logprobs_end - 1);
      const int end = std::min(first_token + chunk.num_new_tokens, seq.num_prompt_tokens - 1);
      if (begin < end) {
        const int32_t first_row = row - (chunk.num_new_tokens - 1);
        step.prompt_rows.push_back(
            PromptLogprobRows{&seq, begin + 1, end - begin, prompt_logit_rows.size()});
        for (int t = begin; t < end; ++t)
          prompt_logit_rows.push_back(first_row + (t - first_token));
      }
    }
  }
  // Prompt rows go after the sampling rows.
  for (PromptLogprobRows& rows : step.prompt_rows) rows.first_logit += step.batch.logit_rows.size();
  step.batch.logit_rows.insert(step.batch.logit_rows.end(), prompt_logit_rows.begin(),
                               prompt_logit_rows.end());
  return step;
}

}  // namespace attnres
