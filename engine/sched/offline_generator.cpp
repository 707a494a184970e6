#include "engine/sched/offline_generator.h"

#include <chrono>
#include <memory>
#include <random>
#include <unordered_map>

#include "engine/core/error.h"
#include "engine/sched/output_processor.h"
#include "engine/sched/scheduler.h"
#include "engine/sched/step_batch.h"
#include "engine/sched/tokenizer_text_decoder.h"

namespace attnres {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

OfflineGenerator::OfflineGenerator(ModelRunner& runner, std::shared_ptr<const Tokenizer> tokenizer,
                                   std::vector<int32_t> eos_ids, OfflineGeneratorOptions options)
    : runner_(runner), tokenizer_(std::move(tokenizer)), options_(options) {
  context_.vocabulary = Vocabulary::of(
      runner_.vocab_size(), tokenizer_ ? tokenizer_->vocab_size() : runner_.vocab_size());
  context_.eos_ids = std::move(eos_ids);
  if (options_.block_size < 1 || options_.num_kv_blocks < 0 || options_.max_prefill_tokens < 1) {
    throw Error("offline generator: block_size and max_prefill_tokens must be >= 1");
  }
}

void OfflineGenerator::validate(const std::vector<GenerationRequest>& requests,
                                const Vocabulary& vocabulary, int max_model_len) {
  for (const GenerationRequest& r : requests) {
    if (r.prompt_ids.empty()) throw Error("prompt is empty: at least one token is needed");
    r.params.validate(vocabulary);
    for (size_t i = 0; i < r.prompt_ids.size(); ++i) {
      vocabulary.check("prompt[" + std::to_string(i) + "]", r.prompt_ids[i]);
    }
    const int64_t len = static_cast<int64_t>(r.prompt_ids.size()) + r.params.max_tokens;
    if (len > max_model_len) {
      throw Error("prompt (" + std::to_string(r.prompt_ids.size()) + " tokens) plus max_tokens (" +
                  std::to_string(r.params.max_tokens) + ") exceeds the model's context length " +
                  std::to_string(max_model_len));
    }
  }
}

int OfflineGenerator::blocks_needed(const std::vector<GenerationRequest>& requests,
                                    int block_size) {
  int64_t total = 0;
  for (const GenerationRequest& r : requests) {
    const int64_t len =
        static_cast<int64_t>(r.prompt_ids.size()) + std::max(0, r.params.max_tokens);
    total += (len + block_size - 1) / block_size;
  }
  return static_cast<int>(std::min<int64_t>(total, 1 << 30));
}

std::vector<GenerationResult> OfflineGenerator::generate(
    const std::vector<GenerationRequest>& requests, const TextCallback& on_text,
    GenerationTimings* timings) {
  const int block_size = options_.block_size;
  validate(requests, context_.vocabulary, options_.max_model_len);
  const int needed = blocks_needed(requests, block_size);
  if (needed > options_.num_kv_blocks) {
    throw Error("these requests need " + std::to_string(needed) +
                " KV cache blocks, the cache has " + std::to_string(options_.num_kv_blocks));
  }
  BlockManager blocks(options_.num_kv_blocks, block_size);
  // The engine's output path: sampler, stop checks, detokenizer (OutputProcessor).
  OutputProcessor processor(context_, DepthAttentionLayout{},
                            tokenizer_ ? make_text_decoder_factory(tokenizer_) : nullptr);

  // One sequence per request, its id the request's index (what the fault hook sees).
  std::random_device entropy;
  std::vector<std::unique_ptr<Sequence>> sequences;
  std::unordered_map<const Sequence*, size_t> index_of;
  std::vector<GenerationResult> results(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    SamplingParams params = requests[i].params;
    params.prompt_logprobs = -1;  // neither is reported here
    params.depth_attention = params.depth_attention_per_token = false;
    sequences.push_back(std::make_unique<Sequence>(std::to_string(i), 0, requests[i].prompt_ids,
                                                   std::move(params), i, EngineClock::now()));
    const uint64_t fallback_seed = (static_cast<uint64_t>(entropy()) << 32) | entropy();
    processor.add(*sequences.back(), fallback_seed);
    index_of[sequences.back().get()] = i;
  }

  // One step: the chunks' batch through the runner, then every sampled sequence's output.
  StepResult result;
  auto run_step = [&](const ScheduleOutput& schedule) {
    const StepPlan plan = build_step_batch(schedule, block_size);
    runner_.execute(plan.batch, result);
    StepOutputs step_outputs = processor.process(plan, result);
    for (SequenceStepOutput& step : step_outputs.sequences) {
      Sequence& seq = *step.seq;
      const size_t i = index_of.at(&seq);
      GenerationResult& out = results[i];
      if (step.failed) {
        // Only this sequence ends; the others run on.
        out.error = step.output.error;
        out.finish_reason = FinishReason::Abort;
        const auto ids = seq.output_ids();
        out.token_ids.assign(ids.begin(), ids.end());
        out.text = processor.text(seq);
        blocks.free(seq.blocks);
        continue;
      }
      RequestOutput& token = step.output;
      out.token_ids.insert(out.token_ids.end(), token.token_ids.begin(), token.token_ids.end());
      for (TokenLogprob& lp : token.logprobs) out.logprobs.push_back(std::move(lp));
      out.finish_reason = token.finish_reason;
      if (token.finished()) {
        out.text = processor.text(seq);
        blocks.free(seq.blocks);
      }
      if (on_text && !token.text.empty()) on_text(i, token.text);
    }
  };

  // Prefill: the prompts in order, in steps of at most max_prefill_tokens tokens; a prompt's
  // last chunk asks for the logits of its last position (the first token is sampled there).
  auto start = Clock::now();
  {
    size_t next = 0;      // the request being prefilled
    int next_offset = 0;  // its tokens already scheduled
    while (next < sequences.size()) {
      ScheduleOutput schedule;
      int budget = options_.max_prefill_tokens;
      while (next < sequences.size() && budget > 0) {
        Sequence& seq = *sequences[next];
        const int count = std::min(budget, seq.num_prompt_tokens - next_offset);
        blocks.append(seq.blocks, count);
        budget -= count;
        next_offset += count;
        const bool last_chunk = next_offset == seq.num_prompt_tokens;
        schedule.chunks.push_back(ScheduledChunk{&seq, count, last_chunk});
        schedule.num_batched_tokens += count;
        if (last_chunk) {
          ++next;
          next_offset = 0;
        }
      }
      run_step(schedule);
      if (timings) timings->prefill_tokens += schedule.num_batched_tokens;
    }
    if (timings) timings->prefill_seconds += seconds_since(start);
  }
  // Decode: one token per unfinished sequence per step.
  for (;;) {
    ScheduleOutput schedule;
    for (size_t i = 0; i < sequences.size(); ++i) {
      if (results[i].finish_reason != FinishReason::None) continue;
      Sequence& seq = *sequences[i];
      blocks.append(seq.blocks, 1);
      schedule.chunks.push_back(ScheduledChunk{&seq, 1, true});
      schedule.num_batched_tokens += 1;
    }
    if (schedule.empty()) break;
    start = Clock::now();
    run_step(schedule);
    if (timings) {
      timings->decode_seconds += seconds_since(start);
      timings->decode_steps += 1;
    }
  }
  return results;
}

}  // namespace attnres
