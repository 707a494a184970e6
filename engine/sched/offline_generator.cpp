#include "engine/sched/offline_generator.h"

#include <chrono>
#include <random>

#include "engine/core/error.h"
#include "engine/sched/batch_builder.h"
#include "engine/sched/tokenizer_text_decoder.h"

namespace attnres {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Per-request state while it runs.
struct Running {
  const GenerationRequest* request;
  std::string id;  // the request's index, for the fault hook
  GenerationResult result;
  SequenceBlocks blocks;
  SequenceOutput output;
  std::vector<int32_t> token_ids;  // prompt, then the generated ids

  bool finished() const { return result.finish_reason != FinishReason::None; }
};

}  // namespace

OfflineGenerator::OfflineGenerator(ModelRunner& runner, std::shared_ptr<const Tokenizer> tokenizer,
                                   std::vector<int32_t> eos_ids, OfflineGeneratorOptions options)
    : runner_(runner),
      tokenizer_(std::move(tokenizer)),
      options_(options) {
  context_.vocabulary =
      Vocabulary::of(runner_.vocab_size(), tokenizer_ ? tokenizer_->vocab_size() : runner_.vocab_size());
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
  const int vocab_size = runner_.vocab_size();
  const int block_size = options_.block_size;
  validate(requests, context_.vocabulary, options_.max_model_len);
  const int needed = blocks_needed(requests, block_size);
  if (needed > options_.num_kv_blocks) {
    throw Error("these requests need " + std::to_string(needed) +
                " KV cache blocks, the cache has " + std::to_string(options_.num_kv_blocks));
  }
  BlockManager blocks(options_.num_kv_blocks, block_size);

  std::random_device entropy;
  std::vector<Running> running;
  running.reserve(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    const uint64_t fallback_seed = (static_cast<uint64_t>(entropy()) << 32) | entropy();
    auto decoder = tokenizer_ ? make_text_decoder_factory(tokenizer_)(r.params) : nullptr;
    running.push_back(Running{&r, std::to_string(i), {}, {},
                              SequenceOutput(r.params, fallback_seed, context_.eos_ids,
                                             std::move(decoder)),
                              r.prompt_ids});
  }

  StepResult result;
  auto sample_step = [&](const StepBatch& batch, const std::vector<size_t>& which) {
    runner_.execute(batch, result);
    std::vector<float>& logits_host = result.logits;
    const size_t vocab = static_cast<size_t>(vocab_size);
    for (size_t i = 0; i < which.size(); ++i) {
      Running& seq = running[which[i]];
      std::span<float> row(logits_host.data() + i * vocab, vocab);
      const int num_prompt = static_cast<int>(seq.request->prompt_ids.size());
      SampledToken token;
      try {
        token = seq.output.next(row, seq.token_ids, num_prompt, context_, seq.id);
      } catch (const std::exception& e) {
        // Only this sequence ends; the others run on.
        seq.result.error = e.what();
        seq.result.finish_reason = FinishReason::Abort;
        seq.result.token_ids.assign(seq.token_ids.begin() + num_prompt, seq.token_ids.end());
        seq.result.text = seq.output.text();
        blocks.free(seq.blocks);
        continue;
      }
      seq.result.token_ids.push_back(token.id);
      if (token.logprob) seq.result.logprobs.push_back(std::move(*token.logprob));
      seq.result.finish_reason = token.finish;
      if (token.finish != FinishReason::None) {
        seq.result.text = seq.output.text();
        blocks.free(seq.blocks);
      }
      if (on_text && !token.text.empty()) on_text(which[i], token.text);
    }
  };

  // Prefill: the prompts in order, in steps of at most max_prefill_tokens tokens; a prompt's
  // last chunk asks for the logits of its last position (the first token is sampled there).
  auto start = Clock::now();
  {
    size_t next = 0;      // the request being prefilled
    int next_offset = 0;  // its tokens already scheduled
    while (next < running.size()) {
      StepBatch batch;
      std::vector<size_t> which;
      int budget = options_.max_prefill_tokens;
      while (next < running.size() && budget > 0) {
        Running& seq = running[next];
        const auto& prompt = seq.request->prompt_ids;
        const int count = std::min(budget, static_cast<int>(prompt.size()) - next_offset);
        blocks.append(seq.blocks, count);
        const int32_t last_row = add_to_batch(
            batch.meta, seq.blocks, std::span(prompt).subspan(next_offset, count), block_size);
        budget -= count;
        next_offset += count;
        if (next_offset == static_cast<int>(prompt.size())) {
          batch.logit_rows.push_back(last_row);
          which.push_back(next);
          ++next;
          next_offset = 0;
        }
      }
      sample_step(batch, which);
      if (timings) timings->prefill_tokens += batch.meta.num_tokens;
    }
    if (timings) timings->prefill_seconds += seconds_since(start);
  }
  // Decode: one token per unfinished sequence per step.
  for (;;) {
    StepBatch batch;
    std::vector<size_t> which;
    for (size_t i = 0; i < running.size(); ++i) {
      Running& seq = running[i];
      if (seq.finished()) continue;
      blocks.append(seq.blocks, 1);
      const int32_t last = seq.token_ids.back();
      batch.logit_rows.push_back(
          add_to_batch(batch.meta, seq.blocks, std::span(&last, 1), block_size));
      which.push_back(i);
    }
    if (which.empty()) break;
    start = Clock::now();
    sample_step(batch, which);
    if (timings) {
      timings->decode_seconds += seconds_since(start);
      timings->decode_steps += 1;
    }
  }

  std::vector<GenerationResult> results;
  for (Running& seq : running) results.push_back(std::move(seq.result));
  return results;
}

}  // namespace attnres
