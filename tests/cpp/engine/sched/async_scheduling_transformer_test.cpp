// Async scheduling with the real forward: a small random-weight Transformer on the CPU
// backend behind TransformerRunner (device sampling on: the CPU's sample op), its steps run on
// another thread (ThreadedRunner) so the engine's gap work really overlaps them. The streams
// must be identical with the overlap on and off: greedy and seeded sampling on either path,
// penalties, logprobs, stop strings, max_tokens, n > 1, a cancel mid-stream, preemption under
// a tight cache, prefix caching. (The CPU backend is batch-invariant, so a different batching
// of the same requests could not change a token either: any difference is a bug of the loop.)
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/random_weights.h"
#include "engine/model/transformer.h"
#include "engine/runner/transformer_runner.h"
#include "engine_test_util.h"
#include "kernels/cpu/cpu_backend.h"
#include "threaded_runner.h"

namespace attnres::testing {
namespace {

constexpr int kModelVocab = 301;

// d 64, 2 layers; mode "" is a plain qwen3, else an AttnRes model of that attnres_mode.
ModelConfig small_config(const std::string& mode) {
  nlohmann::json j = {{"model_type", mode.empty() ? "qwen3" : "qwen3_attnres"},
                      {"hidden_size", 64},
                      {"num_hidden_layers", 2},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 16},
                      {"intermediate_size", 96},
                      {"vocab_size", kModelVocab},
                      {"max_position_embeddings", 512},
                      {"tie_word_embeddings", true},
                      {"rms_norm_eps", 1e-6}};
  if (!mode.empty()) {
    j["attnres_mode"] = mode;
    j["attnres_num_blocks"] = 2;
  }
  return ModelConfig::from_json(j, "async scheduling test config " + mode);
}

// Token t reads as the letter 'a' + t % 26: stop strings have text to match.
class LetterDecoder : public TextDecoder {
 public:
  std::string push(int32_t token) override { return std::string(1, char('a' + token % 26)); }
  std::string flush() override { return {}; }
};

std::vector<int32_t> prompt_ids(int length, int salt) {
  std::vector<int32_t> ids = {5, 17, 42, 99, 7, 250, 3, 61};  // shared by every prompt
  for (int i = 0; i < length; ++i) ids.push_back((salt * 37 + i * 11) % kModelVocab);
  return ids;
}

std::vector<EngineRequest> requests() {
  std::vector<EngineRequest> out;
  for (int i = 0; i < 8; ++i) {
    EngineRequest r;
    r.request_id = numbered("q", i);
    r.prompt_ids = prompt_ids(3 + 4 * i, i);
    r.params.max_tokens = 6 + 3 * i;
    r.params.temperature = 0.0f;
    switch (i % 4) {
      case 1:                         // seeded sampling on the device, n > 1
        r.params.temperature = 6.0f;  // random weights make peaked rows: flatten them
        r.params.top_k = 20;
        r.params.seed = 1234;
        r.n = 2;
        break;
      case 2:  // penalties (device path) and a stop string made of common letters
        r.params.temperature = 4.0f;
        r.params.seed = 5;
        r.params.presence_penalty = 2.0f;
        r.params.frequency_penalty = 1.0f;
        r.params.repetition_penalty = 3.0f;
        r.params.stop = {"e", "k"};
        break;
      case 3:  // logprobs: a host row
        r.params.temperature = 6.0f;
        r.params.top_p = 0.9f;
        r.params.seed = 77;
        r.params.logprobs = 3;
        break;
      default:
        break;
    }
    out.push_back(std::move(r));
  }
  return out;
}

struct Options {
  const char* name;
  const char* mode;
  int num_blocks;
  bool prefix_caching;
  int cancel_after_steps;  // q0 is cancelled after this many steps (0: never)
};

struct Streams {
  std::vector<Collected> outputs;
  std::vector<std::vector<std::vector<TokenLogprob>>> logprobs;  // per request, per output
  EngineStats stats;
};

Streams run(const Options& o, const ModelWeights& weights, bool async) {
  const ModelConfig config = small_config(o.mode);
  CpuBackend backend(1);
  Transformer model(config, weights, backend);
  TransformerRunner transformer(model, o.num_blocks, 4);
  ThreadedRunner threaded(transformer);
  EngineConfig engine_config;
  engine_config.scheduler.max_num_seqs = 8;
  engine_config.scheduler.max_num_batched_tokens = 24;
  engine_config.scheduler.max_model_len = 128;
  engine_config.num_kv_blocks = o.num_blocks;
  engine_config.block_size = 4;
  engine_config.enable_prefix_caching = o.prefix_caching;
  engine_config.async_scheduling = async;
  engine_config.make_decoder = [](const SamplingParams&) {
    return std::make_unique<LetterDecoder>();
  };
  EngineCore engine(engine_config, async ? static_cast<ModelRunner&>(threaded) : transformer);
  EXPECT_EQ(engine.async_scheduling(), async);
  EXPECT_TRUE(engine.samples_on_device());
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (const EngineRequest& r : requests()) {
    SubmitResult submitted = engine.submit(r);
    EXPECT_TRUE(submitted.accepted()) << submitted.message;
    streams.push_back(std::move(submitted.stream));
  }
  Streams out;
  out.outputs.resize(streams.size());
  out.logprobs.resize(streams.size());
  int steps = 0;
  for (;;) {
    const bool more = engine.step();
    ++steps;
    if (steps == o.cancel_after_steps) engine.abort("q0");
    // Read as the engine goes (a front end would), so outputs interleave with steps.
    for (size_t i = 0; i < streams.size(); ++i) {
      RequestOutput output;
      while (streams[i]->try_next(output) == RequestStream::Poll::Output) {
        Collected& c = out.outputs[i];
        c.tokens[output.choice_index].insert(c.tokens[output.choice_index].end(),
                                             output.token_ids.begin(), output.token_ids.end());
        c.text[output.choice_index] += output.text;
        c.last[output.choice_index] = output;
        out.logprobs[i].push_back(output.logprobs);
      }
    }
    if (!more || steps > 2000) break;
  }
  EXPECT_LE(steps, 2000) << "the engine did not go idle";
  out.stats = engine.stats();
  return out;
}

class AsyncSchedulingTransformer : public ::testing::TestWithParam<Options> {};

TEST_P(AsyncSchedulingTransformer, SameStreamsWithAndWithoutTheOverlap) {
  const Options& o = GetParam();
  const ModelWeights weights = make_random_weights(small_config(o.mode), {DType::F32, 21});
  const Streams want = run(o, weights, false);
  const Streams got = run(o, weights, true);
  ASSERT_EQ(got.outputs.size(), want.outputs.size());
  for (size_t i = 0; i < want.outputs.size(); ++i) {
    EXPECT_EQ(got.outputs[i].tokens, want.outputs[i].tokens) << "request " << i;
    EXPECT_EQ(got.outputs[i].text, want.outputs[i].text) << "request " << i;
    for (const auto& [choice, last] : want.outputs[i].last) {
      EXPECT_EQ(got.outputs[i].last.at(choice).finish_reason, last.finish_reason)
          << "request " << i << " choice " << choice;
      EXPECT_EQ(got.outputs[i].last.at(choice).error, last.error);
    }
    ASSERT_EQ(got.logprobs[i].size(), want.logprobs[i].size()) << "request " << i;
    for (size_t k = 0; k < want.logprobs[i].size(); ++k) {
      ASSERT_EQ(got.logprobs[i][k].size(), want.logprobs[i][k].size());
      for (size_t j = 0; j < want.logprobs[i][k].size(); ++j) {
        EXPECT_EQ(got.logprobs[i][k][j].logprob, want.logprobs[i][k][j].logprob);
      }
    }
  }
  // The workload does what it is meant to exercise.
  int stopped_by_string = 0;
  for (const Collected& c : want.outputs) {
    for (const auto& [choice, last] : c.last) {
      stopped_by_string += last.stop_string.has_value();
    }
  }
  EXPECT_GT(stopped_by_string, 0);
  if (o.cancel_after_steps > 0) {
    EXPECT_EQ(got.outputs[0].last.at(0).finish_reason, FinishReason::Abort);
  }
  if (o.prefix_caching) {
    EXPECT_GT(got.stats.prefix_cache_hits_total, 0);
  }
  if (o.num_blocks < 40) {
    EXPECT_GT(want.stats.preemptions_total, 0);
    EXPECT_GT(got.stats.preemptions_total, 0);
  }
  EXPECT_EQ(got.stats.kv_cache_usage, 0.0);
  EXPECT_EQ(got.stats.generation_tokens_total, want.stats.generation_tokens_total);
  EXPECT_TRUE(got.stats.alive);
}

INSTANTIATE_TEST_SUITE_P(Workloads, AsyncSchedulingTransformer,
                         ::testing::Values(Options{"plain", "", 128, false, 0},
                                           Options{"plain_cancelled", "", 128, false, 3},
                                           Options{"plain_preempting", "", 30, false, 0},
                                           Options{"plain_prefix_cached", "", 128, true, 0},
                                           Options{"attnres_prefix_cached_preempting", "full", 30,
                                                   true, 0}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace attnres::testing
