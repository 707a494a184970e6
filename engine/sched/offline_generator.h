// Runs a fixed set of requests to completion: the engine behind `attnres generate` and
// `attnres bench latency`. It is a thin driver of the server's EngineCore, stepped on the
// caller's thread (no engine thread): the requests are submitted together and every step is
// EngineCore::step(), so the schedule (chunked prefill within max_prefill_tokens per step, then
// one decode step per token), the output path (sampler, stop checks, detokenizer) and fault
// isolation are the server's own. A failure in one sequence's output path ends that sequence
// with its error (GenerationResult::error), exactly as a server request would end, and the
// others run on.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/runner/model_runner.h"
#include "engine/sample/constraint_compiler.h"
#include "engine/sample/sampling_params.h"
#include "engine/sched/sequence_output.h"
#include "engine/tokenizer/tokenizer.h"

namespace attnres {

struct GenerationRequest {
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
};

struct GenerationResult {
  std::vector<int32_t> token_ids;      // generated ids (a final EOS / stop id included)
  std::vector<TokenLogprob> logprobs;  // one per generated id when params.logprobs >= 0
  std::string text;                    // detokenized, truncated before a stop string
  FinishReason finish_reason = FinishReason::None;  // Abort when `error` is set
  std::string error;  // why the sequence's output path failed (sequence_output.h)
};

// Steps that computed prompt tokens count as prefill (when all prompts fit one step's budget,
// that is the first step alone), the other steps as decode. prefill_tokens: prompt tokens
// computed.
struct GenerationTimings {
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int prefill_tokens = 0;
  int decode_steps = 0;
};

struct OfflineGeneratorOptions {
  int num_kv_blocks = 0;  // the runner's cache, in blocks (blocks_needed() sizes it)
  int block_size = 16;
  int max_model_len = 0;          // prompt + max_tokens limit
  int max_prefill_tokens = 8192;  // tokens computed per step (the scheduler's token budget)
  bool device_sampling = true;    // EngineConfig::device_sampling (--no-device-sampling)
  bool async_scheduling = true;   // EngineConfig::async_scheduling (--no-async-scheduling)
};

class OfflineGenerator {
 public:
  OfflineGenerator(ModelRunner& runner, std::shared_ptr<const Tokenizer> tokenizer,
                   std::vector<int32_t> eos_ids, OfflineGeneratorOptions options);

  // Throws attnres::Error for a request generate() would refuse (empty prompt, a token the
  // vocabulary cannot decode, bad sampling parameters, prompt + max_tokens > max_model_len).
  // Call it before sizing a cache with blocks_needed().
  static void validate(const std::vector<GenerationRequest>& requests, const Vocabulary& vocabulary,
                       int max_model_len);
  // KV blocks a set of requests needs at most (each prompt plus its max_tokens).
  static int blocks_needed(const std::vector<GenerationRequest>& requests, int block_size);

  // Streaming hook: text that became final for request i (never part of a stop string).
  // The prompts' prompt_logprobs and depth-attention requests are ignored (nothing reports
  // them here).
  using TextCallback = std::function<void(size_t request, std::string_view delta)>;
  std::vector<GenerationResult> generate(const std::vector<GenerationRequest>& requests,
                                         const TextCallback& on_text = {},
                                         GenerationTimings* timings = nullptr);

  // Tests only: injects failures into the sequences' output paths (request ids are the
  // requests' indices as decimal strings).
  void set_output_fault_hook(OutputFaultHook hook) { context_.fault_hook = std::move(hook); }

 private:
  ModelRunner& runner_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  OutputContext context_;  // vocabulary, eos ids, fault hook: what the engine is built with
  OfflineGeneratorOptions options_;
  // Structured output: built at the first constrained request, kept for later generate() calls.
  std::shared_ptr<const ConstraintCompiler> constraints_;
};

}  // namespace attnres
