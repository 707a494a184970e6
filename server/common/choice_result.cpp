#include "server/common/choice_result.h"

namespace attnres::server {

void ChoiceResult::add(const RequestOutput& out) {
  if (out.cached_prompt_tokens) cached_prompt_tokens = *out.cached_prompt_tokens;
  text += out.text;
  token_ids.insert(token_ids.end(), out.token_ids.begin(), out.token_ids.end());
  logprobs.insert(logprobs.end(), out.logprobs.begin(), out.logprobs.end());
  if (!out.prompt_logprobs.empty()) prompt_logprobs = out.prompt_logprobs;
  if (out.depth_prompt_mean) depth_prompt_mean = out.depth_prompt_mean;
  depth_per_token.insert(depth_per_token.end(), out.depth_per_token.begin(),
                         out.depth_per_token.end());
  if (out.finished()) {
    finish_reason = out.finish_reason;
    stop_string = out.stop_string;
    stop_token = out.stop_token;
    error = out.error;
  }
}

}  // namespace attnres::server
