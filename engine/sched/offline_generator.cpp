#include "engine/sched/offline_generator.h"

#include <chrono>
#include <random>

#include "engine/core/error.h"
#include "engine/sched/batch_builder.h"

namespace attnres {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Per-request state while it runs.
struct Running {
  const GenerationRequest* request;
  GenerationResult result;
  SequenceBlocks blocks;
  Sampler sampler;
  StopChecker stop;
  IncrementalDecoder decoder;
  size_t released = 0;  // bytes of result.text already passed to the callback
};

}  // namespace

OfflineGenerator::OfflineGenerator(ModelRunner& runner, std::shared_ptr<const Tokenizer> tokenizer,
                                   std::vector<int32_t> eos_ids, OfflineGeneratorOptions options)
    : runner_(runner),
      tokenizer_(std::move(tokenizer)),
      eos_ids_(std::move(eos_ids)),
      options_(options) {
  if (options_.block_size < 1 || options_.num_kv_blocks < 0 || options_.max_prefill_tokens < 1) {
    throw Error("offline generator: block_size and max_prefill_tokens must be >= 1");
  }
}

void OfflineGenerator::validate(const std::vector<GenerationRequest>& requests, int vocab_size,
                                int max_model_len) {
  for (const GenerationRequest& r : requests) {
    if (r.prompt_ids.empty()) throw Error("prompt is empty: at least one token is needed");
    r.params.validate(vocab_size);
    for (int32_t id : r.prompt_ids) {
      if (id < 0 || id >= vocab_size) {
        throw Error("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                    std::to_string(vocab_size) + ")");
      }
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
  validate(requests, vocab_size, options_.max_model_len);
  const int needed = blocks_needed(requests, block_size);
  if (needed > options_.num_kv_blocks) {
    throw Error("these requests need " + std::to_string(needed) +
                " KV cache blocks, the cache has " + std::to_string(options_.num_kv_blocks));
  }
  BlockManager blocks(options_.num_kv_blocks, block_size);

  std::random_device entropy;
  std::vector<Running> running;
  running.reserve(requests.size());
  for (const GenerationRequest& r : requests) {
    const uint64_t fallback_seed = (static_cast<uint64_t>(entropy()) << 32) | entropy();
    running.push_back(Running{&r,
                              {},
                              {},
                              Sampler(r.params, fallback_seed),
                              StopChecker(r.params, eos_ids_),
                              IncrementalDecoder(tokenizer_, r.params.skip_special_tokens)});
  }

  std::vector<float> logits_host;
  auto sample_step = [&](const BatchMeta& batch, const std::vector<int32_t>& rows,
                         const std::vector<size_t>& which) {
    runner_.execute(batch, rows, logits_host);
    const size_t vocab = static_cast<size_t>(vocab_size);
    for (size_t i = 0; i < which.size(); ++i) {
      Running& seq = running[which[i]];
      std::span<float> row(logits_host.data() + i * vocab, vocab);
      TokenLogprob logprob;
      const bool want_logprobs = seq.request->params.logprobs >= 0;
      const int32_t token = seq.sampler.sample(row, seq.request->prompt_ids, seq.result.token_ids,
                                               eos_ids_, want_logprobs ? &logprob : nullptr);
      seq.result.token_ids.push_back(token);
      if (want_logprobs) seq.result.logprobs.push_back(std::move(logprob));
      seq.result.text += seq.decoder.push(token);
      seq.result.finish_reason =
          seq.stop.check(token, static_cast<int>(seq.result.token_ids.size()), seq.result.text);
      if (seq.result.finish_reason != FinishReason::None) {
        // The stop checker knows where the output ends: before a stop string or a stop
        // token's text; at a length limit, after whatever the decoder still holds.
        if (seq.result.finish_reason == FinishReason::Length)
          seq.result.text += seq.decoder.flush();
        seq.result.text.resize(seq.stop.releasable_length(seq.result.text));
        blocks.free(seq.blocks);
      }
      const size_t ready = seq.result.finish_reason != FinishReason::None
                               ? seq.result.text.size()
                               : seq.stop.releasable_length(seq.result.text);
      if (on_text && ready > seq.released) {
        on_text(which[i],
                std::string_view(seq.result.text).substr(seq.released, ready - seq.released));
      }
      seq.released = std::max(seq.released, ready);
    }
  };

  // Prefill: the prompts in order, in steps of at most max_prefill_tokens tokens; a prompt's
  // last chunk asks for the logits of its last position (the first token is sampled there).
  auto start = Clock::now();
  {
    size_t next = 0;      // the request being prefilled
    int next_offset = 0;  // its tokens already scheduled
    while (next < running.size()) {
      BatchMeta batch;
      std::vector<int32_t> rows;
      std::vector<size_t> which;
      int budget = options_.max_prefill_tokens;
      while (next < running.size() && budget > 0) {
        Running& seq = running[next];
        const auto& prompt = seq.request->prompt_ids;
        const int count = std::min(budget, static_cast<int>(prompt.size()) - next_offset);
        blocks.append(seq.blocks, count);
        const int32_t last_row = add_to_batch(
            batch, seq.blocks, std::span(prompt).subspan(next_offset, count), block_size);
        budget -= count;
        next_offset += count;
        if (next_offset == static_cast<int>(prompt.size())) {
          rows.push_back(last_row);
          which.push_back(next);
          ++next;
          next_offset = 0;
        }
      }
      sample_step(batch, rows, which);
      if (timings) timings->prefill_tokens += batch.num_tokens;
    }
    if (timings) timings->prefill_seconds += seconds_since(start);
  }
  // Decode: one token per unfinished sequence per step.
  for (;;) {
    BatchMeta batch;
    std::vector<int32_t> rows;
    std::vector<size_t> which;
    for (size_t i = 0; i < running.size(); ++i) {
      Running& seq = running[i];
      if (seq.result.finish_reason != FinishReason::None) continue;
      blocks.append(seq.blocks, 1);
      const int32_t last = seq.result.token_ids.back();
      rows.push_back(add_to_batch(batch, seq.blocks, std::span(&last, 1), block_size));
      which.push_back(i);
    }
    if (which.empty()) break;
    start = Clock::now();
    sample_step(batch, rows, which);
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
