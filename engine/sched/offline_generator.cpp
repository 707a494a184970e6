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

OfflineGenerator::OfflineGenerator(Transformer& model, std::shared_ptr<const Tokenizer> tokenizer,
                                   std::vector<int32_t> eos_ids, int block_size)
    : model_(model),
      tokenizer_(std::move(tokenizer)),
      eos_ids_(std::move(eos_ids)),
      block_size_(block_size) {}

std::vector<GenerationResult> OfflineGenerator::generate(
    const std::vector<GenerationRequest>& requests, const TextCallback& on_text,
    GenerationTimings* timings) {
  const ModelConfig& config = model_.config();
  int total_blocks = 0;
  for (const GenerationRequest& r : requests) {
    if (r.prompt_ids.empty()) throw Error("prompt is empty: at least one token is needed");
    r.params.validate(config.vocab_size);
    for (int32_t id : r.prompt_ids) {
      if (id < 0 || id >= config.vocab_size) {
        throw Error("prompt token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                    std::to_string(config.vocab_size) + ")");
      }
    }
    const int64_t len = static_cast<int64_t>(r.prompt_ids.size()) + r.params.max_tokens;
    if (len > config.max_position_embeddings) {
      throw Error("prompt (" + std::to_string(r.prompt_ids.size()) + " tokens) plus max_tokens (" +
                  std::to_string(r.params.max_tokens) + ") exceeds the model's context length " +
                  std::to_string(config.max_position_embeddings));
    }
    total_blocks += static_cast<int>((len + block_size_ - 1) / block_size_);
  }
  Backend& backend = model_.backend();
  KvCache cache = KvCache::allocate(backend, config, total_blocks, block_size_);
  BlockManager blocks(total_blocks, block_size_);

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
    Tensor logits = model_.forward(batch, cache, rows);
    const size_t vocab = static_cast<size_t>(config.vocab_size);
    logits_host.resize(logits.numel());
    backend.download(logits, logits_host.data());
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

  // Prefill: every prompt in one step.
  auto start = Clock::now();
  {
    BatchMeta batch;
    std::vector<int32_t> rows;
    std::vector<size_t> which;
    for (size_t i = 0; i < running.size(); ++i) {
      Running& seq = running[i];
      blocks.append(seq.blocks, static_cast<int>(seq.request->prompt_ids.size()));
      rows.push_back(add_to_batch(batch, seq.blocks, seq.request->prompt_ids, block_size_));
      which.push_back(i);
    }
    sample_step(batch, rows, which);
    if (timings) {
      timings->prefill_seconds += seconds_since(start);
      timings->prefill_tokens += batch.num_tokens;
    }
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
      rows.push_back(add_to_batch(batch, seq.blocks, std::span(&last, 1), block_size_));
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
