// One sequence's output path after the forward: guard its logits row, sample, detokenize,
// check stops and decide how much text is final. The server's engine loop and the offline
// generator (attnres generate / bench latency) both run it, so they sample and stop alike.
//
// Fault isolation (docs/ENGINE_CONTRACT.md): everything here belongs to one sequence. A
// failure throws attnres::Error naming the stage; the caller ends only that sequence, with
// the error, and every other sequence of the step carries on. Only a failure of the step
// itself (the forward, the backend) may stop the engine.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/runner/model_runner.h"
#include "engine/sample/constraint_matcher.h"
#include "engine/sample/logprobs.h"
#include "engine/sample/sampler.h"
#include "engine/sample/stop_checker.h"
#include "engine/sample/vocabulary.h"

namespace attnres {

// The per-sequence stages of a step's output path, in order.
enum class OutputStage {
  PromptLogprobs,  // a prompt position's logprobs (echo + logprobs, prompt_logprobs)
  DepthAttention,  // adding the step's depth-attention rows to the sequence's sums
  CheckLogits,     // the sampling row must be finite (NaN / +inf: the model broke for it)
  Sample,          // logits processors, sampler, the sampled token's logprobs
  Detokenize,      // the incremental detokenizer
  StopCheck,       // stop tokens, stop strings, lengths
};
const char* output_stage_name(OutputStage stage);

// Test seam: called at the start of each stage with the stage and the sequence's request id;
// throwing from it injects a failure there. Empty in production.
using OutputFaultHook = std::function<void(OutputStage stage, std::string_view request_id)>;

// Runs `stage` of a sequence's output path: the hook, then fn. Any exception comes out as an
// attnres::Error "<stage> failed: <what>". A template: it runs several times per token.
[[noreturn]] void rethrow_as_stage_error(OutputStage stage, const std::exception& e);
template <typename Fn>
void run_output_stage(OutputStage stage, std::string_view request_id,
                      const OutputFaultHook& hook, Fn&& fn) {
  try {
    if (hook) hook(stage, request_id);
    fn();
  } catch (const std::exception& e) {
    rethrow_as_stage_error(stage, e);
  }
}

// Throws attnres::Error when one logits row holds a NaN or +inf, or no finite value among the
// ids the vocabulary can decode: the model broke for this sequence.
void check_logits_row(std::span<const float> logits, const Vocabulary& vocabulary);

struct SampledToken {
  int32_t id = 0;
  std::optional<TokenLogprob> logprob;  // when params.logprobs >= 0
  std::string text;                     // text that became final with this token
  FinishReason finish = FinishReason::None;
};

// What a sequence's output path needs from its surroundings (one per engine / generator).
struct OutputContext {
  Vocabulary vocabulary;
  std::vector<int32_t> eos_ids;
  OutputFaultHook fault_hook;  // tests only
};

class SequenceOutput {
 public:
  // decoder may be null: the sequence then produces token ids only, no text. constraint: the
  // compiled params.constraint (ConstraintCompiler::compile), null when unconstrained.
  SequenceOutput(const SamplingParams& params, uint64_t fallback_seed,
                 const std::vector<int32_t>& eos_ids, std::unique_ptr<TextDecoder> decoder,
                 std::shared_ptr<const CompiledConstraint> constraint = nullptr);

  // Structured output: computes the next token's allowed-token mask now (the engine calls it
  // while the forward runs); next() computes it itself when this was not called. Never throws:
  // a failure is reported by next()'s sampling stage.
  void prepare_constraint() noexcept;

  // Turns this step's logits row (modified in place) into the next token. token_ids: the
  // sequence's prompt then output ids; the new token is appended to it. Throws attnres::Error
  // naming the stage that failed; the sequence must then be ended by the caller.
  SampledToken next(std::span<float> logits, std::vector<int32_t>& token_ids,
                    int num_prompt_tokens, const OutputContext& context,
                    std::string_view request_id);

  // Device sampling (docs/ENGINE_CONTRACT.md, "Where sampling happens"): appends this step's
  // row to `batch` (Sampler::add_device_row: the uniform is drawn here).
  void add_device_row(std::span<const int32_t> token_ids, int num_prompt_tokens,
                      const OutputContext& context, SampleBatch& batch);
  // next() for a token sampled on the device: `sampled` is Backend::sample's answer for the
  // row add_device_row described (a token id, or a kSample* code, reported as the host path
  // reports the same row).
  SampledToken next_sampled(int32_t sampled, std::vector<int32_t>& token_ids, int num_prompt_tokens,
                            const OutputContext& context, std::string_view request_id);

  const std::string& text() const { return text_; }
  const StopChecker& stop() const { return stop_; }

 private:
  // The stages after sampling (detokenize, stop check, text release), shared by both paths.
  void finish_token(SampledToken& token, std::vector<int32_t>& token_ids, int num_prompt_tokens,
                    const OutputContext& context, std::string_view request_id);

  Sampler sampler_;
  std::optional<ConstraintMatcher> constraint_;  // structured output, when the request has one
  StopChecker stop_;
  std::unique_ptr<TextDecoder> decoder_;
  std::string text_;     // detokenized output so far
  size_t released_ = 0;  // bytes of text_ already handed out
  std::vector<float> raw_logits_;  // the unmasked row, for logprobs
};

}  // namespace attnres
