// Sampling on the device (docs/ENGINE_CONTRACT.md, "Where sampling happens"): the engine hands
// a runner that samples_on_device() the rows it may sample there, with their parameters and
// uniforms, and takes token ids back. Here the "device" is the CPU backend's sample op over
// FakeRunner's logits, and the check is the contract's promise: the same tokens, logprobs and
// finish reasons as the host path, for seeded and greedy requests batched together with
// parameters of every kind and rows that must fall back to the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/sched/engine_core.h"
#include "engine/sched/offline_generator.h"
#include "engine_test_util.h"
#include "fake_model.h"
#include "kernels/cpu/cpu_backend.h"

namespace attnres::testing {
namespace {

// FakeRunner's logits for every row; batch.sample_rows sampled by CpuBackend::sample.
class CpuSamplingRunner : public FakeRunner {
 public:
  CpuSamplingRunner(int num_blocks, int block_size)
      : FakeRunner(num_blocks, block_size), backend_(make_cpu_backend(2)) {}

  bool samples_on_device() const override { return true; }

  void execute(const StepBatch& step, StepResult& result) override {
    EXPECT_EQ(step.sampling.rows.size(), step.sample_rows.size());
    StepBatch all = step;  // the fake forward computes the sampled rows' logits too, first
    all.logit_rows = step.sample_rows;
    all.logit_rows.insert(all.logit_rows.end(), step.logit_rows.begin(), step.logit_rows.end());
    all.sample_rows.clear();
    FakeRunner::execute(all, result);
    const size_t sampled = step.sample_rows.size();
    device_rows_ += static_cast<int>(sampled);
    host_rows_ += static_cast<int>(step.logit_rows.size());
    result.sampled_ids.resize(sampled);
    if (sampled == 0) return;
    Tensor logits = Tensor::wrap(result.logits.data(), {static_cast<int64_t>(sampled), kVocab},
                                 DType::F32, nullptr);
    backend_->sample(logits, step.sampling, result.sampled_ids);
    result.logits.erase(result.logits.begin(),
                        result.logits.begin() + static_cast<std::ptrdiff_t>(sampled * kVocab));
  }

  int device_rows() const { return device_rows_; }
  int host_rows() const { return host_rows_; }

 private:
  std::unique_ptr<Backend> backend_;
  int device_rows_ = 0;
  int host_rows_ = 0;
};

EngineRequest sampled_request(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
                              uint64_t seed) {
  EngineRequest request;
  request.request_id = id;
  request.prompt_ids = std::move(prompt);
  request.params.temperature = 1.0f;
  request.params.seed = seed;
  request.params.max_tokens = max_tokens;
  return request;
}

// Every kind of row in one batch: greedy (penalised, min_tokens), random with each truncation
// and penalty, n > 1, prompt logprobs (its sampling row may go to the device), and the rows
// that must stay on the host (logprobs, logit_bias, allowed_token_ids).
std::vector<EngineRequest> mixed_requests() {
  std::vector<EngineRequest> requests;
  EngineRequest greedy = greedy_request("greedy", iota_prompt(9, 3), 12);
  greedy.params.repetition_penalty = 1.3f;
  greedy.params.presence_penalty = 0.5f;
  greedy.params.frequency_penalty = 0.4f;
  greedy.params.min_tokens = 4;
  requests.push_back(greedy);

  EngineRequest top_k = sampled_request("top_k", iota_prompt(6, 10), 14, 11);
  top_k.params.temperature = 0.8f;
  top_k.params.top_k = 5;
  requests.push_back(top_k);

  EngineRequest nucleus = sampled_request("nucleus", iota_prompt(7, 20), 14, 12);
  nucleus.params.temperature = 1.3f;
  nucleus.params.top_p = 0.7f;
  nucleus.params.min_p = 0.05f;
  nucleus.params.repetition_penalty = 1.2f;
  nucleus.params.frequency_penalty = -0.3f;
  nucleus.params.stop_token_ids = {5, 6};
  nucleus.params.min_tokens = 6;
  requests.push_back(nucleus);

  EngineRequest choices = sampled_request("choices", iota_prompt(5, 30), 10, 13);
  choices.n = 3;
  choices.params.temperature = 1.7f;
  choices.params.top_k = 20;
  choices.params.top_p = 0.9f;
  choices.params.presence_penalty = 1.0f;
  requests.push_back(choices);

  EngineRequest prompt_logprobs = sampled_request("prompt_logprobs", iota_prompt(8, 40), 8, 14);
  prompt_logprobs.params.prompt_logprobs = 2;
  prompt_logprobs.params.min_p = 0.3f;
  requests.push_back(prompt_logprobs);

  EngineRequest logprobs = sampled_request("logprobs", iota_prompt(6, 50), 9, 15);
  logprobs.params.logprobs = 3;
  logprobs.params.top_k = 8;
  requests.push_back(logprobs);

  EngineRequest bias = sampled_request("bias", iota_prompt(6, 2), 9, 16);
  bias.params.logit_bias = {{7, 3.0f}, {9, -2.0f}};
  requests.push_back(bias);

  EngineRequest allowed = greedy_request("allowed", iota_prompt(5, 17), 6);
  allowed.params.allowed_token_ids = {3, 4, 8, 21};
  requests.push_back(allowed);
  return requests;
}

struct EngineRun {
  std::map<std::string, Collected> outputs;
  int device_rows = 0;
  int host_rows = 0;
};

EngineRun run_requests(bool device_sampling) {
  CpuSamplingRunner runner(64, 4);
  runner.set_smooth_logits(true);
  runner.set_allow_inner_rows(true);  // prompt logprobs
  EngineSetup setup;
  setup.max_num_seqs = 16;
  setup.max_num_batched_tokens = 128;
  EngineConfig config = engine_config(setup);
  config.device_sampling = device_sampling;
  EngineCore engine(std::move(config), runner);
  std::map<std::string, std::unique_ptr<RequestStream>> streams;
  for (EngineRequest& request : mixed_requests()) {
    const std::string id = request.request_id;
    SubmitResult submitted = engine.submit(std::move(request));
    EXPECT_TRUE(submitted.accepted()) << id << ": " << submitted.message;
    streams[id] = std::move(submitted.stream);
  }
  run_until_idle(engine);
  EngineRun run;
  for (auto& [id, stream] : streams) run.outputs[id] = drain(*stream);
  run.device_rows = runner.device_rows();
  run.host_rows = runner.host_rows();
  return run;
}

TEST(DeviceSampling, GivesTheHostPathsTokensLogprobsAndFinishReasons) {
  const EngineRun host = run_requests(false);
  const EngineRun device = run_requests(true);
  EXPECT_EQ(host.device_rows, 0);
  EXPECT_GT(device.device_rows, 40);  // every row but the fallback requests'
  EXPECT_LT(device.host_rows, host.host_rows);
  ASSERT_EQ(host.outputs.size(), device.outputs.size());
  for (const auto& [id, expected] : host.outputs) {
    const Collected& got = device.outputs.at(id);
    ASSERT_EQ(got.tokens.size(), expected.tokens.size()) << id;
    for (const auto& [choice, tokens] : expected.tokens) {
      EXPECT_FALSE(tokens.empty()) << id;
      EXPECT_EQ(got.tokens.at(choice), tokens) << id << " choice " << choice;
      const RequestOutput& a = expected.last.at(choice);
      const RequestOutput& b = got.last.at(choice);
      EXPECT_EQ(b.finish_reason, a.finish_reason) << id;
      EXPECT_TRUE(b.error.empty()) << id << ": " << b.error;
      ASSERT_EQ(b.logprobs.size(), a.logprobs.size()) << id;
      for (size_t i = 0; i < a.logprobs.size(); ++i) {
        EXPECT_EQ(b.logprobs[i].token_id, a.logprobs[i].token_id) << id;
        EXPECT_EQ(b.logprobs[i].logprob, a.logprobs[i].logprob) << id;
      }
    }
  }
  // The choices of a seeded request differ (seed + i), so the draws really are random ones.
  const auto& choices = host.outputs.at("choices").tokens;
  EXPECT_TRUE(choices.at(0) != choices.at(1) || choices.at(1) != choices.at(2));
}

TEST(DeviceSampling, ANonFiniteRowEndsOnlyItsSequence) {
  CpuSamplingRunner runner(64, 4);
  runner.set_smooth_logits(true);
  const std::vector<int32_t> broken_prompt = iota_prompt(5, 40);
  runner.set_row_editor([&](const std::vector<int32_t>& context, std::span<float> row) {
    if (context.size() >= broken_prompt.size() &&
        std::equal(broken_prompt.begin(), broken_prompt.end(), context.begin()) &&
        context.size() == broken_prompt.size() + 2) {
      row[3] = std::numeric_limits<float>::quiet_NaN();
    }
  });
  EngineCore engine(engine_config({}), runner);
  SubmitResult broken = engine.submit(sampled_request("broken", broken_prompt, 6, 1));
  SubmitResult healthy = engine.submit(greedy_request("healthy", iota_prompt(5, 1), 6));
  run_until_idle(engine);
  const Collected b = drain(*broken.stream);
  const Collected h = drain(*healthy.stream);
  EXPECT_EQ(b.tokens.at(0).size(), 2u);
  EXPECT_EQ(b.last.at(0).finish_reason, FinishReason::Abort);
  EXPECT_NE(b.last.at(0).error.find("logits check failed: the model produced a non-finite logit"),
            std::string::npos)
      << b.last.at(0).error;
  EXPECT_EQ(h.tokens.at(0), reference_tokens(iota_prompt(5, 1), 6));
  EXPECT_TRUE(engine.stats().alive);
  EXPECT_GT(runner.device_rows(), 0);
}

// EngineConfig::device_sampling (EngineArgs, --no-device-sampling) reaches the engine, which
// samples on the device only when the runner can too.
TEST(DeviceSampling, TheSwitchReachesTheEngine) {
  CpuSamplingRunner device_runner(64, 4);
  FakeRunner host_runner(64, 4);
  for (bool on : {false, true}) {
    EngineConfig config = engine_config({});
    config.device_sampling = on;
    EXPECT_EQ(EngineCore(config, device_runner).samples_on_device(), on);
    EXPECT_FALSE(EngineCore(config, host_runner).samples_on_device());
  }
}

// The offline generator (attnres generate, attnres bench) passes its option to its engine:
// off, no row reaches the sample op; on, the same tokens come from it.
TEST(DeviceSampling, TheOfflineGeneratorPassesTheSwitchOn) {
  std::vector<GenerationRequest> requests;
  for (uint64_t seed : {3, 4, 5}) {
    GenerationRequest request{iota_prompt(6, static_cast<int>(seed)), {}};
    request.params.temperature = seed == 3 ? 0.0f : 1.0f;
    request.params.seed = seed;
    request.params.top_k = 20;
    request.params.max_tokens = 8;
    requests.push_back(request);
  }
  std::map<bool, std::vector<std::vector<int32_t>>> tokens;
  for (bool on : {false, true}) {
    CpuSamplingRunner runner(64, 4);
    runner.set_smooth_logits(true);
    OfflineGeneratorOptions options;
    options.num_kv_blocks = 64;
    options.block_size = 4;
    options.max_model_len = 64;
    options.device_sampling = on;
    OfflineGenerator generator(runner, nullptr, {}, options);
    for (const GenerationResult& result : generator.generate(requests)) {
      EXPECT_TRUE(result.error.empty()) << result.error;
      EXPECT_EQ(result.token_ids.size(), 8u);
      tokens[on].push_back(result.token_ids);
    }
    if (on) {
      EXPECT_GT(runner.device_rows(), 0);
    } else {
      EXPECT_EQ(runner.device_rows(), 0);
    }
  }
  EXPECT_EQ(tokens[true], tokens[false]);
}

}  // namespace
}  // namespace attnres::testing
