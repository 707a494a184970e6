// The engine step's "process outputs" stage: turns a forward's StepResult into one
// RequestOutput per sampled sequence. It owns every sequence's output state: the sampler, stop
// checker and detokenizer (SequenceOutput, sequence_output.h), the prompt logprobs collected
// until the first output, and the depth-attention prompt sums.
//
// It never ends a sequence itself and never touches a request's stream: it reports what
// happened (a token, a finish reason, or a failure), and the engine delivers, finishes and
// retires (engine_core.h). So nothing here outlives, or destroys, the sequences it reads.
//
// Fault isolation (docs/ENGINE_CONTRACT.md): a failure in one sequence's path (prompt
// logprobs, depth rows, a non-finite logits row, the sampler, the detokenizer, stop checks)
// marks that sequence failed; the later stages of the step skip it and it is reported after
// every other sequence's output, with finish reason Abort and the error.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/core/depth_attention.h"
#include "engine/sched/request_stream.h"
#include "engine/sched/sequence.h"
#include "engine/sched/sequence_output.h"
#include "engine/sched/step_batch.h"

namespace attnres {

// What one sequence got from a step.
struct SequenceStepOutput {
  Sequence* seq = nullptr;
  // A token was sampled and appended to seq->token_ids (true also when a later stage of the
  // same step failed: the token counts towards the request's usage).
  bool sampled = false;
  // Its output for the stream: a token (finished() when a stop condition ended it), or, when
  // failed, finish reason Abort with the error ("<stage> failed: ...").
  RequestOutput output;
  bool failed = false;
};

struct StepOutputs {
  EngineClock::time_point time;  // when the outputs were processed (RequestOutput::time)
  // Sequences that sampled without a failure, in sampling-row order, then the failed ones.
  std::vector<SequenceStepOutput> sequences;
};

class OutputProcessor {
 public:
  // context.vocabulary must have the runner's rows; make_decoder may be empty (token ids
  // only, no text).
  OutputProcessor(OutputContext context, DepthAttentionLayout depth_layout,
                  TextDecoderFactory make_decoder);

  // A new sequence (one choice of an accepted request); fallback_seed seeds its sampler when
  // its params carry no seed; constraint: its compiled params.constraint (null: none).
  void add(const Sequence& seq, uint64_t fallback_seed,
           std::shared_ptr<const CompiledConstraint> constraint = nullptr);
  // Forgets a retired sequence's state.
  void remove(const Sequence& seq);

  // Device sampling: fills plan.batch.sampling with one row per plan.device_samplers (each
  // sequence's uniform is drawn here, before the forward; docs/ENGINE_CONTRACT.md, "Where
  // sampling happens").
  void add_device_rows(StepPlan& plan);

  // Structured output: computes the allowed-token masks of the plan's constrained samplers
  // (the engine calls it while the forward runs) and writes the device samplers' into
  // plan.batch.sampling.bitmask (their SampleRow::bitmask_row). Never throws: a failure fails
  // its sequence in process().
  void prepare_constraints(StepPlan& plan);

  // The step's outputs: prompt logprob rows and depth prompt rows first (they are a sequence's
  // history), then one sampled token per sampling row (host rows, then device rows).
  // result.logits rows are modified in place (logits processors, padding masks).
  StepOutputs process(const StepPlan& plan, StepResult& result);

  // The sequence's detokenized output so far, text not yet released included.
  const std::string& text(const Sequence& seq);

  const OutputContext& context() const { return context_; }

 private:
  struct State {
    explicit State(SequenceOutput sequence_output) : output(std::move(sequence_output)) {}

    SequenceOutput output;  // sampler, stop checker, detokenizer
    // Prompt logprobs collected so far (positions [0, prompt_logprobs_end)); sent with the
    // first output, once.
    std::vector<std::optional<TokenLogprob>> prompt_logprobs;
    bool prompt_logprobs_sent = false;
    // Depth-attention weights: the sum over prompt positions [0, depth_prompt_end) (double, so
    // the mean of a long prompt does not depend on how it was chunked), sent once.
    std::vector<double> depth_prompt_sum;
    bool depth_prompt_sent = false;
  };

  State& state_of(const Sequence& seq);
  void add_prompt_logprobs(Sequence& seq, State& state, const PromptLogprobRows& rows,
                           std::span<float> logits);
  void add_depth_prompt_rows(Sequence& seq, State& state, const DepthPromptRows& rows,
                             std::span<const float> depth_weights);
  // Samples the sequence's next token from its logits row and builds its output. depth_row:
  // the sampled position's depth-mix weights when the sequence wants them per token, else
  // null. Sets `sampled` once the token is appended; throws when the sequence's path fails.
  RequestOutput sample(Sequence& seq, State& state, std::span<float> logits, const float* depth_row,
                       EngineClock::time_point now, bool& sampled);
  // The same for a token sampled on the device (device_result: StepResult::sampled_ids').
  RequestOutput sampled_on_device(Sequence& seq, State& state, int32_t device_result,
                                  const float* depth_row, EngineClock::time_point now,
                                  bool& sampled);
  // A sampled token's output: logprobs, prompt logprobs and depth weights when due.
  RequestOutput token_output(Sequence& seq, State& state, SampledToken token,
                             const float* depth_row, EngineClock::time_point now);

  const OutputContext context_;
  const DepthAttentionLayout depth_layout_;
  const size_t depth_cells_;  // layout rows * cols
  const TextDecoderFactory make_decoder_;
  std::unordered_map<const Sequence*, State> states_;
};

}  // namespace attnres
