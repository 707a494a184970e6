// Everything one choice produced, accumulated over its outputs: what a non-streamed HTTP
// response and a gRPC GenerateComplete report at the choice's end.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/sched/request_stream.h"

namespace attnres::server {

struct ChoiceResult {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;
  std::vector<std::optional<TokenLogprob>> prompt_logprobs;  // when asked
  std::optional<DepthAttentionMatrix> depth_prompt_mean;     // when asked
  std::vector<DepthAttentionMatrix> depth_per_token;         // when asked per token
  FinishReason finish_reason = FinishReason::None;
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token;
  std::string error;
  int cached_prompt_tokens = 0;  // of this choice's prompt, from the prefix cache

  void add(const RequestOutput& out);
};

}  // namespace attnres::server
