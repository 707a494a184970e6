#include "server/grpc/grpc_responses.h"

#include "engine/sample/stop_checker.h"

namespace attnres::server {

void to_proto(const DepthAttentionMatrix& matrix, v1::DepthAttentionMatrix& proto) {
  proto.set_rows(static_cast<uint32_t>(matrix.rows));
  proto.set_cols(static_cast<uint32_t>(matrix.cols));
  proto.mutable_values()->Add(matrix.values.begin(), matrix.values.end());
}

void to_proto(const TokenLogprob& logprob, v1::TokenLogprob& proto) {
  proto.set_token_id(logprob.token_id);
  proto.set_logprob(logprob.logprob);
  proto.set_rank(logprob.rank);
  for (const auto& [id, value] : logprob.top) {
    v1::TopLogprob* top = proto.add_top_logprobs();
    top->set_token_id(id);
    top->set_logprob(value);
  }
}

v1::GenerateStreamChunk make_chunk(const RequestOutput& out, bool with_text) {
  v1::GenerateStreamChunk chunk;
  chunk.set_index(static_cast<uint32_t>(out.choice_index));
  chunk.mutable_token_ids()->Add(out.token_ids.begin(), out.token_ids.end());
  if (with_text) chunk.set_text(out.text);
  for (const TokenLogprob& lp : out.logprobs) to_proto(lp, *chunk.add_logprobs());
  for (const DepthAttentionMatrix& m : out.depth_per_token)
    to_proto(m, *chunk.add_depth_attention());
  return chunk;
}

v1::GenerateComplete make_complete(const RequestOutput& last, const ChoiceResult& choice,
                                   int prompt_tokens, bool with_text, bool streamed,
                                   const DepthAttentionLayout* depth_layout) {
  v1::GenerateComplete complete;
  complete.set_index(static_cast<uint32_t>(last.choice_index));
  complete.set_finish_reason(finish_reason_name(last.finish_reason));
  complete.mutable_output_ids()->Add(choice.token_ids.begin(), choice.token_ids.end());
  if (with_text) complete.set_text(choice.text);
  if (last.stop_string) {
    complete.set_stop_string(*last.stop_string);
  } else if (last.stop_token) {
    complete.set_stop_token_id(*last.stop_token);
  }
  v1::Usage* usage = complete.mutable_usage();
  const auto completion = static_cast<uint32_t>(choice.token_ids.size());
  usage->set_prompt_tokens(static_cast<uint32_t>(prompt_tokens));
  usage->set_completion_tokens(completion);
  usage->set_total_tokens(static_cast<uint32_t>(prompt_tokens) + completion);
  usage->set_cached_tokens(static_cast<uint32_t>(choice.cached_prompt_tokens));
  if (!streamed) {
    for (const TokenLogprob& lp : choice.logprobs) to_proto(lp, *complete.add_logprobs());
  }
  complete.set_error(last.error);
  if (depth_layout && choice.depth_prompt_mean) {
    v1::DepthAttention* depth = complete.mutable_depth_attention();
    depth->mutable_sublayers()->Add(depth_layout->sublayers.begin(), depth_layout->sublayers.end());
    depth->mutable_sources()->Add(depth_layout->sources.begin(), depth_layout->sources.end());
    to_proto(*choice.depth_prompt_mean, *depth->mutable_prompt_mean());
    if (!streamed) {
      for (const DepthAttentionMatrix& m : choice.depth_per_token)
        to_proto(m, *depth->add_per_token());
    }
  }
  return complete;
}

v1::GetModelInfoResponse make_model_info(const LoadedModel& model,
                                         const std::string& served_model_name, int max_model_len,
                                         const DepthAttentionLayout& depth_layout) {
  const ModelConfig& config = model.config;
  v1::GetModelInfoResponse info;
  info.set_served_model_name(served_model_name);
  info.set_model_source(model.source);
  info.set_max_model_len(static_cast<uint32_t>(max_model_len));
  info.set_vocab_size(static_cast<uint32_t>(config.vocab_size));  // the logits' size
  info.set_architecture(std::string(architecture_name(config.arch)));
  info.set_model_type(config.model_type);
  info.set_attnres_mode(std::string(attnres_mode_name(config.attnres_mode)));
  info.set_attnres_num_blocks(static_cast<uint32_t>(config.attnres_num_blocks));
  info.set_num_layers(static_cast<uint32_t>(config.num_layers));
  for (int32_t id : model.eos_token_ids()) info.add_eos_token_ids(id);
  if (config.bos_token_id) info.set_bos_token_id(*config.bos_token_id);
  info.mutable_depth_attention_sublayers()->Add(depth_layout.sublayers.begin(),
                                                depth_layout.sublayers.end());
  info.mutable_depth_attention_sources()->Add(depth_layout.sources.begin(),
                                              depth_layout.sources.end());
  return info;
}

}  // namespace attnres::server
