#include "engine/sched/sequence_output.h"

#include "engine/sample/sample_row.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"
#include "engine/sample/token_bitmask.h"

namespace attnres {

const char* output_stage_name(OutputStage stage) {
  switch (stage) {
    case OutputStage::PromptLogprobs:
      return "prompt logprobs";
    case OutputStage::DepthAttention:
      return "depth attention";
    case OutputStage::CheckLogits:
      return "logits check";
    case OutputStage::Sample:
      return "sampling";
    case OutputStage::Detokenize:
      return "detokenizing";
    case OutputStage::StopCheck:
      return "stop check";
  }
  return "output";
}

void rethrow_as_stage_error(OutputStage stage, const std::exception& e) {
  throw Error(std::string(output_stage_name(stage)) + " failed: " + e.what());
}

void check_logits_row(std::span<const float> logits, const Vocabulary& vocabulary) {
  const LogitsVerdict verdict = check_logits(logits, vocabulary.decodable);
  if (verdict.code == kSampleNonFiniteLogit) {
    const float x = logits[static_cast<size_t>(verdict.at)];
    throw Error("the model produced a non-finite logit (" +
                std::string(std::isnan(x) ? "NaN" : "+inf") + " for token id " +
                std::to_string(verdict.at) + ")");
  }
  if (verdict.code == kSampleNoDecodableLogit) {
    throw Error("the model produced no finite logit for a token it can decode");
  }
}

SequenceOutput::SequenceOutput(const SamplingParams& params, uint64_t fallback_seed,
                               const std::vector<int32_t>& eos_ids,
                               std::unique_ptr<TextDecoder> decoder,
                               std::shared_ptr<const CompiledConstraint> constraint)
    : sampler_(params, fallback_seed), stop_(params, eos_ids), decoder_(std::move(decoder)) {
  if (params.constraint) {
    ATTNRES_CHECK(constraint != nullptr, "a constrained sequence without its compiled constraint");
    constraint_.emplace(std::move(constraint), params.constraint->enforce_after_token);
  }
}

void SequenceOutput::prepare_constraint() noexcept {
  if (constraint_) constraint_->compute_mask();
}

SampledToken SequenceOutput::next(std::span<float> logits, std::vector<int32_t>& token_ids,
                                  int num_prompt_tokens, const OutputContext& context,
                                  std::string_view request_id) {
  const auto prompt = std::span<const int32_t>(token_ids).first(static_cast<size_t>(num_prompt_tokens));
  const auto output = std::span<const int32_t>(token_ids).subspan(static_cast<size_t>(num_prompt_tokens));
  const OutputFaultHook& hook = context.fault_hook;
  SampledToken token;
  run_output_stage(OutputStage::CheckLogits, request_id, hook,
                   [&] { check_logits_row(logits, context.vocabulary); });
  run_output_stage(OutputStage::Sample, request_id, hook, [&] {
    // Logprobs describe the model's own distribution (every row, raw logits); sampling never
    // picks a padding row the tokenizer cannot decode.
    const int top_k = sampler_.params().logprobs;
    if (top_k >= 0) raw_logits_.assign(logits.begin(), logits.end());
    context.vocabulary.mask_padding(logits);
    // Structured output masks first, like allowed_token_ids; the sampled token then advances
    // the grammar (a token it rejects fails this sequence alone).
    if (constraint_) constraint_->apply(logits);
    token.id = sampler_.sample(logits, prompt, output, context.eos_ids, nullptr);
    if (constraint_) constraint_->accept(token.id);
    if (top_k >= 0) {
      token.logprob = compute_logprobs(raw_logits_, token.id, top_k, context.vocabulary.decodable);
    }
  });
  finish_token(token, token_ids, num_prompt_tokens, context, request_id);
  return token;
}

void SequenceOutput::add_device_row(std::span<const int32_t> token_ids, int num_prompt_tokens,
                                    const OutputContext& context, SampleBatch& batch) {
  const auto prompt = token_ids.first(static_cast<size_t>(num_prompt_tokens));
  const auto output = token_ids.subspan(static_cast<size_t>(num_prompt_tokens));
  sampler_.add_device_row(prompt, output, context.eos_ids, batch);
  if (constraint_ && constraint_->enforcing()) {
    const size_t words = static_cast<size_t>(token_bitmask_words(context.vocabulary.rows));
    ATTNRES_CHECK(constraint_->mask().size() == words,
                  "a constraint's mask of " + std::to_string(constraint_->mask().size()) +
                      " words for " + std::to_string(context.vocabulary.rows) + " logits");
    batch.rows.back().bitmask_row = static_cast<int32_t>(batch.bitmask.size() / words);
    batch.bitmask.resize(batch.bitmask.size() + words);
  }
}

void SequenceOutput::write_constraint_mask(std::span<int32_t> words) noexcept {
  if (constraint_) constraint_->write_mask(words);
}

SampledToken SequenceOutput::next_sampled(int32_t sampled, std::vector<int32_t>& token_ids,
                                          int num_prompt_tokens, const OutputContext& context,
                                          std::string_view request_id) {
  const OutputFaultHook& hook = context.fault_hook;
  SampledToken token;
  run_output_stage(OutputStage::CheckLogits, request_id, hook, [&] {
    // check_logits_row's messages, less the token id (the row stayed on the device).
    if (sampled == kSampleNonFiniteLogit) {
      throw Error("the model produced a non-finite logit (NaN or +inf; sampled on the device)");
    }
    if (sampled == kSampleNoDecodableLogit) {
      throw Error("the model produced no finite logit for a token it can decode");
    }
  });
  run_output_stage(OutputStage::Sample, request_id, hook, [&] {
    // The host path's order: the constraint's dead end first, then the sampler's verdict, then
    // the grammar takes the token.
    if (constraint_) constraint_->check_mask();
    ATTNRES_CHECK(sampled != kSampleEveryLogitMasked, "every logit is -inf");
    ATTNRES_CHECK(context.vocabulary.contains(sampled), "the device sampled token id " +
                                                            std::to_string(sampled) +
                                                            ", which the vocabulary cannot decode");
    token.id = sampled;
    if (constraint_) constraint_->accept(token.id);
  });
  finish_token(token, token_ids, num_prompt_tokens, context, request_id);
  return token;
}

void SequenceOutput::finish_token(SampledToken& token, std::vector<int32_t>& token_ids,
                                  int num_prompt_tokens, const OutputContext& context,
                                  std::string_view request_id) {
  const OutputFaultHook& hook = context.fault_hook;
  token_ids.push_back(token.id);
  const int num_generated = static_cast<int>(token_ids.size()) - num_prompt_tokens;
  run_output_stage(OutputStage::Detokenize, request_id, hook, [&] {
    if (decoder_) text_ += decoder_->push(token.id);
  });
  run_output_stage(OutputStage::StopCheck, request_id, hook, [&] {
    token.finish = stop_.check(token.id, num_generated, text_);
    // A grammar that has ended (it accepted a stop token) allows nothing more, even when the
    // stop checker would go on (ignore_eos).
    if (token.finish == FinishReason::None && constraint_ && constraint_->terminated()) {
      token.finish = FinishReason::Stop;
    }
    if (token.finish != FinishReason::None) {
      // The stop checker knows where the output ends: before a stop string or a stop token's
      // text; at a length limit, after whatever the decoder still holds.
      if (token.finish == FinishReason::Length && decoder_) text_ += decoder_->flush();
      text_.resize(std::max(released_, stop_.releasable_length(text_)));
    }
  });
  const size_t ready =
      token.finish != FinishReason::None ? text_.size() : stop_.releasable_length(text_);
  if (ready > released_) {
    token.text = text_.substr(released_, ready - released_);
    released_ = ready;
  }
}

}  // namespace attnres
