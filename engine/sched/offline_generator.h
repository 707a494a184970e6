// Runs a fixed set of requests to completion on one Transformer: one prefill step for all
// prompts, then one decode step per token for every unfinished sequence. This is the
// engine behind `attnres generate`, `attnres logits` and `attnres bench latency`; the
// server's continuous-batching loop (engine/sched, later) reuses the same pieces
// (BlockManager, add_to_batch, Sampler, StopChecker, IncrementalDecoder).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/model/transformer.h"
#include "engine/sample/sampler.h"
#include "engine/sample/sampling_params.h"
#include "engine/sample/stop_checker.h"
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
  FinishReason finish_reason = FinishReason::None;
};

struct GenerationTimings {
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int prefill_tokens = 0;
  int decode_steps = 0;
};

class OfflineGenerator {
 public:
  OfflineGenerator(Transformer& model, std::shared_ptr<const Tokenizer> tokenizer,
                   std::vector<int32_t> eos_ids, int block_size = 16);

  // Streaming hook: text that became final for request i (never part of a stop string).
  using TextCallback = std::function<void(size_t request, std::string_view delta)>;
  std::vector<GenerationResult> generate(const std::vector<GenerationRequest>& requests,
                                         const TextCallback& on_text = {},
                                         GenerationTimings* timings = nullptr);

 private:
  Transformer& model_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::vector<int32_t> eos_ids_;
  int block_size_;
};

}  // namespace attnres
