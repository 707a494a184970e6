// One generated continuation of a request: what the scheduler moves between its queues.
// A request asking for n choices becomes n sequences that share its request id (vLLM's
// fan-out); each owns its KV blocks, so choices are scheduled, preempted and finished
// independently.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/sample/sampling_params.h"
#include "engine/sample/stop_checker.h"
#include "engine/sched/block_manager.h"

namespace attnres {

// Every engine timestamp (arrival, first token, ...) is on this clock.
using EngineClock = std::chrono::steady_clock;

enum class SequenceStatus { Waiting, Running, Finished };

struct Sequence {
  Sequence(std::string request_id, int choice_index, std::span<const int32_t> prompt_ids,
           SamplingParams params, uint64_t arrival_order, EngineClock::time_point arrival_time);

  std::string request_id;
  int choice_index = 0;   // which of the request's n choices
  SamplingParams params;  // this choice's (its seed is the request's seed + choice_index)
  // Prompt then generated tokens, in one array: a prefill chunk after a preemption may span
  // both (recompute re-runs the prompt *and* the output so far).
  std::vector<int32_t> token_ids;
  int num_prompt_tokens = 0;

  SequenceStatus status = SequenceStatus::Waiting;
  FinishReason finish_reason = FinishReason::None;
  std::string error;  // set when the engine, not the stop conditions, ended it

  // blocks.num_tokens is the number of computed tokens (K/V in the cache): it advances when
  // a step's batch is built (add_to_batch) and drops to 0 when the sequence is preempted.
  SequenceBlocks blocks;

  // Scheduling priority: lower arrived earlier. Preemption picks the highest.
  uint64_t arrival_order = 0;
  EngineClock::time_point arrival_time;
  int num_preemptions = 0;

  // Prompt logprobs (params.prompt_logprobs >= 0): those of prompt positions
  // [1, prompt_logprobs_end) are computed. The token at position t - 1 gives position t's, so
  // prefill chunks ask for extra logit rows until this reaches num_prompt_tokens; a recompute
  // after a preemption does not ask again.
  int prompt_logprobs_end = 1;

  bool needs_prompt_logprob_rows() const {
    return params.prompt_logprobs >= 0 && prompt_logprobs_end < num_prompt_tokens;
  }

  // Depth-attention weights (params.wants_depth_attention()): prompt positions
  // [0, depth_prompt_end) are in the running prompt mean. Like prompt_logprobs_end, it never
  // goes back, so a recompute after a preemption does not count a position twice.
  int depth_prompt_end = 0;

  bool needs_depth_prompt_rows() const {
    return params.wants_depth_attention() && depth_prompt_end < num_prompt_tokens;
  }

  // Prefix caching: computed positions below this may come from the cache; the rest must be
  // computed because the sequence still needs rows (prompt logprobs, depth weights) there.
  int first_position_needing_rows() const {
    int first = num_tokens();
    if (needs_prompt_logprob_rows()) first = std::min(first, prompt_logprobs_end - 1);
    if (needs_depth_prompt_rows()) first = std::min(first, depth_prompt_end);
    return first;
  }
  // Tokens the first schedule took from the prefix cache (-1 until first scheduled): OpenAI's
  // usage.prompt_tokens_details.cached_tokens.
  int prefix_cache_hit_tokens = -1;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  int num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
  int num_computed_tokens() const { return blocks.num_tokens; }
  // Tokens whose K/V still have to be computed before the next token can be sampled: the
  // rest of the prompt while prefilling, 1 while decoding, everything after a preemption.
  int num_uncomputed_tokens() const { return num_tokens() - num_computed_tokens(); }
  // A decode step: only the last sampled token is missing from the cache.
  bool is_decoding() const { return num_computed_tokens() > 0 && num_uncomputed_tokens() == 1; }
  bool finished() const { return status == SequenceStatus::Finished; }

  std::span<const int32_t> prompt_ids() const {
    return std::span(token_ids).first(static_cast<size_t>(num_prompt_tokens));
  }
  std::span<const int32_t> output_ids() const {
    return std::span(token_ids).subspan(static_cast<size_t>(num_prompt_tokens));
  }
  void append_token(int32_t token) { token_ids.push_back(token); }
};

}  // namespace attnres
