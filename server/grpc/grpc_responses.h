// engine -> proto: the messages the gRPC service sends (stream chunks, per-choice completions,
// logprobs, model info). Pure functions, so they can be tested without a server.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnres/v1/generate.pb.h"
#include "engine/model/loaded_model.h"
#include "engine/sched/request_stream.h"
#include "server/common/choice_result.h"

namespace attnres::server {

void to_proto(const TokenLogprob& logprob, v1::TokenLogprob& proto);

// The output's delta as a chunk; `with_text` false leaves the text out (detokenize = false).
v1::GenerateStreamChunk make_chunk(const RequestOutput& out, bool with_text);

// The end of a choice. `streamed`: the chunks already carried the logprobs and per-token depth
// weights (not repeated). `depth_layout`: the request asked for depth-attention weights (null:
// it did not).
v1::GenerateComplete make_complete(const RequestOutput& last, const ChoiceResult& choice,
                                   int prompt_tokens, bool with_text, bool streamed,
                                   const DepthAttentionLayout* depth_layout = nullptr);

void to_proto(const DepthAttentionMatrix& matrix, v1::DepthAttentionMatrix& proto);

// `depth_layout`: the labels of the depth-attention matrices (empty for a plain model).
v1::GetModelInfoResponse make_model_info(const LoadedModel& model,
                                         const std::string& served_model_name, int max_model_len,
                                         const DepthAttentionLayout& depth_layout = {});

}  // namespace attnres::server
