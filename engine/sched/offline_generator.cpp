#include "engine/sched/offline_generator.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "engine/core/error.h"
#include "engine/sched/engine_core.h"
#include "engine/sched/tokenizer_constraints.h"
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
  validate(requests, context_.vocabulary, options_.max_model_len);
  const int needed = blocks_needed(requests, options_.block_size);
  if (needed > options_.num_kv_blocks) {
    throw Error("these requests need " + std::to_string(needed) +
                " KV cache blocks, the cache has " + std::to_string(options_.num_kv_blocks));
  }
  // Every request runs at once; nothing waits in a queue or is preempted (the cache fits all).
  const int count = static_cast<int>(std::max<size_t>(1, requests.size()));
  EngineConfig config;
  config.scheduler.max_num_seqs = count;
  config.scheduler.max_num_batched_tokens = options_.max_prefill_tokens;
  config.scheduler.max_model_len = options_.max_model_len;
  config.num_kv_blocks = options_.num_kv_blocks;
  config.block_size = options_.block_size;
  config.max_queued_requests = count;
  config.device_sampling = options_.device_sampling;
  config.async_scheduling = options_.async_scheduling;
  config.eos_ids = context_.eos_ids;
  config.vocabulary = context_.vocabulary;
  config.output_fault_hook = context_.fault_hook;
  if (tokenizer_) config.make_decoder = make_text_decoder_factory(tokenizer_);
  const bool constrained = std::any_of(requests.begin(), requests.end(), [](const auto& r) {
    return r.params.constraint.has_value();
  });
  if (constrained && tokenizer_ && !constraints_) {
    constraints_ = make_constraint_compiler(*tokenizer_, context_.vocabulary, context_.eos_ids);
  }
  config.constraints = constraints_;
  EngineCore engine(std::move(config), runner_);

  // Request i's id is its index (what the fault hook sees).
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (size_t i = 0; i < requests.size(); ++i) {
    EngineRequest request;
    request.request_id = std::to_string(i);
    request.prompt_ids = requests[i].prompt_ids;
    request.params = requests[i].params;
    request.params.prompt_logprobs = -1;  // neither is reported here
    request.params.depth_attention = request.params.depth_attention_per_token = false;
    SubmitResult submitted = engine.submit(std::move(request));
    if (!submitted.accepted()) throw Error(submitted.message);
    streams.push_back(std::move(submitted.stream));
  }

  std::vector<GenerationResult> results(requests.size());
  auto collect = [&] {
    for (size_t i = 0; i < streams.size(); ++i) {
      RequestOutput output;
      while (streams[i]->try_next(output) == RequestStream::Poll::Output) {
        GenerationResult& out = results[i];
        out.token_ids.insert(out.token_ids.end(), output.token_ids.begin(), output.token_ids.end());
        for (TokenLogprob& lp : output.logprobs) out.logprobs.push_back(std::move(lp));
        out.text += output.text;
        if (output.finished()) out.finish_reason = output.finish_reason;
        if (!output.error.empty()) out.error = output.error;
        if (on_text && !output.text.empty()) on_text(i, output.text);
      }
    }
  };
  int64_t prefill_tokens = engine.stats().prompt_tokens_computed_total;
  for (;;) {
    const Clock::time_point start = Clock::now();
    const bool more = engine.step();
    const double seconds = seconds_since(start);
    const EngineStats stats = engine.stats();
    if (!stats.alive) throw Error(stats.error);
    if (timings && stats.prompt_tokens_computed_total > prefill_tokens) {
      timings->prefill_seconds += seconds;
      timings->prefill_tokens +=
          static_cast<int>(stats.prompt_tokens_computed_total - prefill_tokens);
    } else if (timings && more) {
      timings->decode_seconds += seconds;
      timings->decode_steps += 1;
    }
    prefill_tokens = stats.prompt_tokens_computed_total;
    collect();
    if (!more) break;
  }
  return results;
}

}  // namespace attnres
