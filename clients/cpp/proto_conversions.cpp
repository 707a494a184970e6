#include "clients/cpp/proto_conversions.h"

#include <algorithm>
#include <type_traits>

#include "clients/cpp/client_error.h"

namespace attnres::client {
namespace {

ClientError protocol_error(const std::string& what) {
  return ClientError(grpc::StatusCode::INTERNAL, "the server broke the Generate protocol: " + what);
}

void to_proto(const SamplingOptions& s, v1::SamplingParams& p) {
  if (s.temperature) p.set_temperature(*s.temperature);
  if (s.top_p) p.set_top_p(*s.top_p);
  if (s.top_k) p.set_top_k(*s.top_k);
  if (s.min_p) p.set_min_p(*s.min_p);
  if (s.repetition_penalty) p.set_repetition_penalty(*s.repetition_penalty);
  p.set_presence_penalty(s.presence_penalty);
  p.set_frequency_penalty(s.frequency_penalty);
  if (s.seed) p.set_seed(*s.seed);
  if (s.max_tokens) p.set_max_tokens(*s.max_tokens);
  p.set_min_tokens(s.min_tokens);
  for (const std::string& stop : s.stop) p.add_stop(stop);
  for (int32_t id : s.stop_token_ids) p.add_stop_token_ids(id);
  p.set_ignore_eos(s.ignore_eos);
  if (s.logprobs) p.set_logprobs(*s.logprobs);
  if (s.skip_special_tokens) p.set_skip_special_tokens(*s.skip_special_tokens);
  p.set_n(s.n);
  for (const auto& [id, bias] : s.logit_bias) (*p.mutable_logit_bias())[id] = bias;
}

Usage usage_from_proto(const v1::Usage& usage) {
  return {usage.prompt_tokens(), usage.completion_tokens(), usage.total_tokens(),
          usage.cached_tokens()};
}

Choice choice_from_proto(const v1::GenerateComplete& complete) {
  Choice choice;
  choice.index = complete.index();
  choice.text = complete.text();
  choice.token_ids.assign(complete.output_ids().begin(), complete.output_ids().end());
  choice.finish_reason = complete.finish_reason();
  if (complete.has_stop_string()) choice.stop_string = complete.stop_string();
  if (complete.has_stop_token_id()) choice.stop_token_id = complete.stop_token_id();
  choice.usage = usage_from_proto(complete.usage());
  choice.logprobs = from_proto(complete.logprobs());
  choice.error = complete.error();
  return choice;
}

}  // namespace

v1::GenerateRequest to_proto(const GenerateOptions& options) {
  v1::GenerateRequest request;
  request.set_request_id(options.request_id);
  std::visit(
      [&](const auto& prompt) {
        if constexpr (std::is_same_v<std::decay_t<decltype(prompt)>, std::string>) {
          request.set_text(prompt);
        } else {
          auto* ids = request.mutable_token_ids()->mutable_ids();
          ids->Add(prompt.begin(), prompt.end());
        }
      },
      options.prompt);
  to_proto(options.sampling, *request.mutable_sampling_params());
  if (options.add_special_tokens) request.set_add_special_tokens(*options.add_special_tokens);
  request.set_stream(options.stream);
  request.set_detokenize(options.detokenize);
  return request;
}

std::vector<TokenLogprob> from_proto(
    const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& logprobs) {
  std::vector<TokenLogprob> out;
  out.reserve(logprobs.size());
  for (const v1::TokenLogprob& lp : logprobs) {
    TokenLogprob& item = out.emplace_back();
    item.token_id = lp.token_id();
    item.logprob = lp.logprob();
    item.rank = lp.rank();
    for (const v1::TopLogprob& top : lp.top_logprobs()) {
      item.top.emplace_back(top.token_id(), top.logprob());
    }
  }
  return out;
}

ModelInfo from_proto(const v1::GetModelInfoResponse& info) {
  ModelInfo out;
  out.served_model_name = info.served_model_name();
  out.model_source = info.model_source();
  out.max_model_len = info.max_model_len();
  out.vocab_size = info.vocab_size();
  out.architecture = info.architecture();
  out.model_type = info.model_type();
  out.attnres_mode = info.attnres_mode();
  out.attnres_num_blocks = info.attnres_num_blocks();
  out.num_layers = info.num_layers();
  out.eos_token_ids.assign(info.eos_token_ids().begin(), info.eos_token_ids().end());
  if (info.has_bos_token_id()) out.bos_token_id = info.bos_token_id();
  return out;
}

ResultAssembler::ResultAssembler(int n) : choices_(std::max(n, 1)) {}

ResultAssembler::ChoiceState& ResultAssembler::choice_at(uint32_t index, const char* what) {
  if (index >= choices_.size()) {
    throw protocol_error(std::string(what) + " for choice " + std::to_string(index) +
                         ", but only " + std::to_string(choices_.size()) + " were asked for");
  }
  return choices_[index];
}

std::optional<StreamChunk> ResultAssembler::add(const v1::GenerateResponse& response) {
  if (request_id_.empty()) request_id_ = response.request_id();
  if (response.has_chunk()) {
    const v1::GenerateStreamChunk& chunk = response.chunk();
    ChoiceState& state = choice_at(chunk.index(), "a chunk");
    if (state.done) {
      throw protocol_error("a chunk for choice " + std::to_string(chunk.index()) +
                           " after its completion");
    }
    StreamChunk out;
    out.request_id = response.request_id();
    out.index = chunk.index();
    out.token_ids.assign(chunk.token_ids().begin(), chunk.token_ids().end());
    out.text = chunk.text();
    out.logprobs = from_proto(chunk.logprobs());
    state.streamed_logprobs.insert(state.streamed_logprobs.end(), out.logprobs.begin(),
                                   out.logprobs.end());
    return out;
  }
  if (response.has_complete()) {
    const v1::GenerateComplete& complete = response.complete();
    ChoiceState& state = choice_at(complete.index(), "a completion");
    if (state.done) {
      throw protocol_error("choice " + std::to_string(complete.index()) + " completed twice");
    }
    state.done = choice_from_proto(complete);
    // Streamed calls carry the logprobs in the chunks only (generate.proto).
    if (state.done->logprobs.empty()) state.done->logprobs = std::move(state.streamed_logprobs);
    state.streamed_logprobs.clear();
    return std::nullopt;
  }
  throw protocol_error("a response with neither a chunk nor a completion");
}

bool ResultAssembler::complete() const {
  return std::all_of(choices_.begin(), choices_.end(),
                     [](const ChoiceState& c) { return c.done.has_value(); });
}

GenerateResult ResultAssembler::result() const {
  GenerateResult result;
  result.request_id = request_id_;
  for (size_t i = 0; i < choices_.size(); ++i) {
    if (!choices_[i].done) {
      throw protocol_error("the stream ended before choice " + std::to_string(i) + " completed");
    }
    const Choice& choice = *choices_[i].done;
    result.choices.push_back(choice);
    result.usage.prompt_tokens = choice.usage.prompt_tokens;  // the same prompt for every one
    if (i == 0) result.usage.cached_tokens = choice.usage.cached_tokens;  // as OpenAI usage
    result.usage.completion_tokens += choice.usage.completion_tokens;
  }
  result.usage.total_tokens = result.usage.prompt_tokens + result.usage.completion_tokens;
  return result;
}

}  // namespace attnres::client
