#include "engine/sched/output_processor.h"

#include <algorithm>
#include <exception>
#include <string>
#include <utility>

#include "engine/core/error.h"
#include "engine/sample/logprobs.h"
#include "engine/sample/token_bitmask.h"

namespace attnres {

OutputProcessor::OutputProcessor(OutputContext context, DepthAttentionLayout depth_layout,
                                 TextDecoderFactory make_decoder)
    : context_(std::move(context)),
      depth_layout_(std::move(depth_layout)),
      depth_cells_(static_cast<size_t>(depth_layout_.rows() * depth_layout_.cols())),
      make_decoder_(std::move(make_decoder)) {}

void OutputProcessor::add(const Sequence& seq, uint64_t fallback_seed,
                          std::shared_ptr<const CompiledConstraint> constraint) {
  auto decoder = make_decoder_ ? make_decoder_(seq.params) : nullptr;
  SequenceOutput output(seq.params, fallback_seed, context_.eos_ids, std::move(decoder),
                        std::move(constraint));
  const bool added = states_.try_emplace(&seq, std::move(output)).second;
  ATTNRES_CHECK(added, "a sequence added to the output processor twice");
}

void OutputProcessor::remove(const Sequence& seq) { states_.erase(&seq); }

OutputProcessor::State& OutputProcessor::state_of(const Sequence& seq) {
  auto it = states_.find(&seq);
  ATTNRES_CHECK(it != states_.end(), "a sequence unknown to the output processor");
  return it->second;
}

const std::string& OutputProcessor::text(const Sequence& seq) {
  return state_of(seq).output.text();
}

StepOutputs OutputProcessor::process(const StepPlan& plan, StepResult& result) {
  StepOutputs outputs;
  outputs.time = EngineClock::now();
  // A sequence whose path fails is remembered and skipped by the later stages of this step,
  // then reported after the others.
  std::vector<SequenceStepOutput> failed;
  auto has_failed = [&](const Sequence* seq) {
    return std::any_of(failed.begin(), failed.end(),
                       [&](const SequenceStepOutput& f) { return f.seq == seq; });
  };
  // Runs one stage of seq's path; `sampled` (when given) says whether the stage had appended
  // a token before it failed.
  auto guarded = [&](Sequence* seq, auto&& fn, const bool* sampled = nullptr) {
    if (has_failed(seq)) return false;
    try {
      fn();
      return true;
    } catch (const std::exception& e) {
      SequenceStepOutput f;
      f.seq = seq;
      f.sampled = sampled && *sampled;
      f.failed = true;
      f.output.finish_reason = FinishReason::Abort;
      f.output.error = e.what();
      failed.push_back(std::move(f));
      return false;
    }
  };

  for (const PromptLogprobRows& rows : plan.prompt_rows) {
    guarded(rows.seq,
            [&] { add_prompt_logprobs(*rows.seq, state_of(*rows.seq), rows, result.logits); });
  }
  for (const DepthPromptRows& rows : plan.depth_prompt_rows) {
    guarded(rows.seq, [&] {
      add_depth_prompt_rows(*rows.seq, state_of(*rows.seq), rows, result.depth_weights);
    });
  }
  const size_t vocab = static_cast<size_t>(context_.vocabulary.rows);
  for (size_t i = 0; i < plan.samplers.size(); ++i) {
    Sequence* seq = plan.samplers[i];
    const int32_t depth_row = plan.sampler_depth_row[i];
    const float* depth =
        depth_row < 0 ? nullptr : result.depth_weights.data() + depth_row * depth_cells_;
    const std::span<float> logits(result.logits.data() + i * vocab, vocab);
    SequenceStepOutput out;
    out.seq = seq;
    const bool ok = guarded(
        seq,
        [&] {
          out.output = sample(*seq, state_of(*seq), logits, depth, outputs.time, out.sampled);
        },
        &out.sampled);
    if (ok) outputs.sequences.push_back(std::move(out));
  }
  ATTNRES_CHECK(result.sampled_ids.size() == plan.device_samplers.size(),
                "the model runner sampled " + std::to_string(result.sampled_ids.size()) +
                    " rows on the device, expected " + std::to_string(plan.device_samplers.size()));
  for (size_t i = 0; i < plan.device_samplers.size(); ++i) {
    Sequence* seq = plan.device_samplers[i];
    const int32_t depth_row = plan.device_sampler_depth_row[i];
    const float* depth =
        depth_row < 0 ? nullptr : result.depth_weights.data() + depth_row * depth_cells_;
    SequenceStepOutput out;
    out.seq = seq;
    const bool ok = guarded(
        seq,
        [&] {
          out.output = sampled_on_device(*seq, state_of(*seq), result.sampled_ids[i], depth,
                                         outputs.time, out.sampled);
        },
        &out.sampled);
    if (ok) outputs.sequences.push_back(std::move(out));
  }
  for (SequenceStepOutput& f : failed) outputs.sequences.push_back(std::move(f));
  return outputs;
}

void OutputProcessor::add_prompt_logprobs(Sequence& seq, State& state,
                                          const PromptLogprobRows& rows, std::span<float> logits) {
  const size_t vocab = static_cast<size_t>(context_.vocabulary.rows);
  run_output_stage(OutputStage::PromptLogprobs, seq.request_id, context_.fault_hook, [&] {
    ATTNRES_CHECK(rows.first_position == seq.prompt_logprobs_end,
                  "prompt logprob rows out of order");
    if (state.prompt_logprobs.empty()) state.prompt_logprobs.emplace_back();  // position 0
    for (int j = 0; j < rows.count; ++j) {
      const std::span<float> row = logits.subspan((rows.first_logit + j) * vocab, vocab);
      check_logits_row(row, context_.vocabulary);
      const int position = rows.first_position + j;
      state.prompt_logprobs.emplace_back(compute_logprobs(
          row, seq.token_ids[position], seq.params.prompt_logprobs, context_.vocabulary.decodable));
    }
    seq.prompt_logprobs_end += rows.count;
  });
}

void OutputProcessor::add_depth_prompt_rows(Sequence& seq, State& state,
                                            const DepthPromptRows& rows,
                                            std::span<const float> depth_weights) {
  run_output_stage(OutputStage::DepthAttention, seq.request_id, context_.fault_hook, [&] {
    ATTNRES_CHECK(rows.first_position == seq.depth_prompt_end, "depth prompt rows out of order");
    state.depth_prompt_sum.resize(depth_cells_, 0.0);
    for (int j = 0; j < rows.count; ++j) {
      const float* w = depth_weights.data() + (rows.first_depth_row + j) * depth_cells_;
      // Cells a sublayer does not have are NaN in every row, so they stay NaN in the mean.
      for (size_t c = 0; c < depth_cells_; ++c) state.depth_prompt_sum[c] += w[c];
    }
    seq.depth_prompt_end += rows.count;
  });
}

void OutputProcessor::add_device_rows(StepPlan& plan) {
  SampleBatch& batch = plan.batch.sampling;
  batch.clear();
  batch.decodable = context_.vocabulary.decodable;
  for (Sequence* seq : plan.device_samplers) {
    state_of(*seq).output.add_device_row(seq->token_ids, seq->num_prompt_tokens, context_, batch);
  }
}

void OutputProcessor::prepare_constraints(StepPlan& plan) {
  for (Sequence* seq : plan.samplers) {
    if (!seq->params.constraint) continue;
    auto it = states_.find(seq);
    if (it != states_.end()) it->second.output.prepare_constraint();
  }
  SampleBatch& batch = plan.batch.sampling;
  const size_t words = static_cast<size_t>(token_bitmask_words(context_.vocabulary.rows));
  for (size_t i = 0; i < plan.device_samplers.size() && i < batch.rows.size(); ++i) {
    const int32_t mask_row = batch.rows[i].bitmask_row;
    if (mask_row < 0) continue;
    const auto at =
        std::span<int32_t>(batch.bitmask).subspan(static_cast<size_t>(mask_row) * words, words);
    auto it = states_.find(plan.device_samplers[i]);
    if (it != states_.end()) it->second.output.write_constraint_mask(at);
  }
}

RequestOutput OutputProcessor::sample(Sequence& seq, State& state, std::span<float> logits,
                                      const float* depth_row, EngineClock::time_point now,
                                      bool& sampled) {
  SampledToken token =
      state.output.next(logits, seq.token_ids, seq.num_prompt_tokens, context_, seq.request_id);
  sampled = true;
  return token_output(seq, state, std::move(token), depth_row, now);
}

RequestOutput OutputProcessor::sampled_on_device(Sequence& seq, State& state, int32_t device_result,
                                                 const float* depth_row,
                                                 EngineClock::time_point now, bool& sampled) {
  SampledToken token = state.output.next_sampled(device_result, seq.token_ids,
                                                 seq.num_prompt_tokens, context_, seq.request_id);
  sampled = true;
  return token_output(seq, state, std::move(token), depth_row, now);
}

RequestOutput OutputProcessor::token_output(Sequence& seq, State& state, SampledToken token,
                                            const float* depth_row, EngineClock::time_point now) {
  RequestOutput out;
  out.choice_index = seq.choice_index;
  out.token_ids.push_back(token.id);
  if (token.logprob) out.logprobs.push_back(std::move(*token.logprob));
  out.text = std::move(token.text);
  out.finish_reason = token.finish;
  out.time = now;
  if (seq.num_output_tokens() == 1) {
    out.cached_prompt_tokens = std::max(0, seq.prefix_cache_hit_tokens);
  }
  if (seq.params.prompt_logprobs >= 0 && !state.prompt_logprobs_sent) {
    // The first output: the whole prompt has been computed, so every position is in.
    if (state.prompt_logprobs.empty()) state.prompt_logprobs.emplace_back();  // 1-token prompt
    ATTNRES_CHECK(static_cast<int>(state.prompt_logprobs.size()) == seq.num_prompt_tokens,
                  "prompt logprobs incomplete at the first output");
    out.prompt_logprobs = std::move(state.prompt_logprobs);
    state.prompt_logprobs.clear();
    state.prompt_logprobs_sent = true;
  }
  run_output_stage(OutputStage::DepthAttention, seq.request_id, context_.fault_hook, [&] {
    if (seq.params.depth_attention && !state.depth_prompt_sent) {
      // The first output: every prompt position is in the sum.
      ATTNRES_CHECK(seq.depth_prompt_end == seq.num_prompt_tokens,
                    "depth-attention prompt rows incomplete at the first output");
      DepthAttentionMatrix mean{depth_layout_.rows(), depth_layout_.cols(), {}};
      mean.values.reserve(state.depth_prompt_sum.size());
      for (double sum : state.depth_prompt_sum) {
        mean.values.push_back(static_cast<float>(sum / seq.num_prompt_tokens));
      }
      out.depth_prompt_mean = std::move(mean);
      state.depth_prompt_sum = {};
      state.depth_prompt_sent = true;
    }
    if (depth_row) {
      out.depth_per_token.push_back(
          DepthAttentionMatrix{depth_layout_.rows(), depth_layout_.cols(),
                               std::vector<float>(depth_row, depth_row + depth_cells_)});
    }
  });
  if (out.finished()) {
    out.stop_string = state.output.stop().matched_stop_string();
    out.stop_token = state.output.stop().stop_token();
  }
  return out;
}

}  // namespace attnres
