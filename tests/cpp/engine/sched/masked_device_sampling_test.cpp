// Structured output sampled on the device (docs/ENGINE_CONTRACT.md, "Where sampling happens"):
// with a runner that samples_masked_rows(), a constrained row's token bitmask goes to the
// sample op (SampleBatch::bitmask) instead of its logits coming back to the host. Here the
// "device" is the CPU backend's sample op over FakeRunner's logits, launched in two halves as
// TransformerRunner does (the forward, then the sampling once the masks are in), and the checks
// are the contract's: the same tokens and finish reasons as the host path, for constrained and
// unconstrained requests alone and batched together, and a dead end ends its sequence alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../sample/toy_constraint_vocabulary.h"
#include "engine/sched/engine_core.h"
#include "engine_test_util.h"
#include "fake_model.h"
#include "kernels/cpu/cpu_backend.h"

namespace attnres::testing {
namespace {

static_assert(kToyRows == kVocab && kToyEos == kEos, "the toy vocabulary fits the fake model");

// FakeRunner's logits for every row; batch.sample_rows sampled by CpuBackend::sample, after
// launch_sampling() when the batch has masked rows.
class MaskedSamplingRunner : public FakeRunner {
 public:
  MaskedSamplingRunner(int num_blocks, int block_size)
      : FakeRunner(num_blocks, block_size), backend_(make_cpu_backend(2)) {}

  bool samples_on_device() const override { return true; }
  bool samples_masked_rows() const override { return true; }

  void execute(const StepBatch& step, StepResult& result) override {
    launch(step, result);
    if (pending_) launch_sampling(step, result);
    collect(result);
  }

  void launch(const StepBatch& step, StepResult& result) override {
    EXPECT_FALSE(pending_) << "launch() before the last step's sampling";
    EXPECT_EQ(step.sampling.rows.size(), step.sample_rows.size());
    StepBatch all = step;  // the fake forward computes the sampled rows' logits too, first
    all.logit_rows = step.sample_rows;
    all.logit_rows.insert(all.logit_rows.end(), step.logit_rows.begin(), step.logit_rows.end());
    all.sample_rows.clear();
    FakeRunner::execute(all, result);
    sampled_ = step.sample_rows.size();
    device_logits_.assign(result.logits.begin(),
                          result.logits.begin() + static_cast<std::ptrdiff_t>(sampled_ * kVocab));
    result.logits.erase(result.logits.begin(),
                        result.logits.begin() + static_cast<std::ptrdiff_t>(sampled_ * kVocab));
    device_rows_ += static_cast<int>(sampled_);
    host_rows_ += static_cast<int>(step.logit_rows.size());
    pending_ = has_masked_rows(step);
    if (!pending_) sample(step, result);
  }

  void launch_sampling(const StepBatch& step, StepResult& result) override {
    ASSERT_TRUE(pending_) << "launch_sampling() for a batch without masked rows";
    pending_ = false;
    for (const SampleRow& row : step.sampling.rows) masked_rows_ += row.bitmask_row >= 0;
    sample(step, result);
  }

  void collect(StepResult& result) override {
    (void)result;
    EXPECT_FALSE(pending_) << "collect() before launch_sampling()";
  }

  int device_rows() const { return device_rows_; }
  int host_rows() const { return host_rows_; }
  int masked_rows() const { return masked_rows_; }

 private:
  void sample(const StepBatch& step, StepResult& result) {
    result.sampled_ids.assign(sampled_, -100);
    if (sampled_ == 0) return;
    Tensor logits = Tensor::wrap(device_logits_.data(), {static_cast<int64_t>(sampled_), kVocab},
                                 DType::F32, nullptr);
    backend_->sample(logits, step.sampling, result.sampled_ids);
  }

  std::unique_ptr<Backend> backend_;
  std::vector<float> device_logits_;
  size_t sampled_ = 0;
  bool pending_ = false;
  int device_rows_ = 0, host_rows_ = 0, masked_rows_ = 0;
};

OutputConstraint regex(const std::string& pattern) {
  OutputConstraint c;
  c.kind = ConstraintKind::Regex;
  c.spec = pattern;
  c.field = "guided_regex";
  return c;
}

EngineRequest sampled_request(const std::string& id, std::vector<int32_t> prompt, int max_tokens,
                              uint64_t seed, float temperature) {
  EngineRequest request = greedy_request(id, std::move(prompt), max_tokens);
  request.params.temperature = temperature;
  request.params.seed = seed;
  return request;
}

// Constrained (greedy and seeded random, n > 1, penalties, min_tokens) and unconstrained rows.
std::vector<EngineRequest> mixed_requests() {
  std::vector<EngineRequest> requests;
  EngineRequest digits = greedy_request("digits", iota_prompt(7, 3), 10);
  digits.params.constraint = regex("[0-9a]+");
  requests.push_back(digits);

  EngineRequest letters = sampled_request("letters", iota_prompt(6, 5), 12, 21, 1.0f);
  letters.params.constraint = regex("[a-c]{2,6}");
  letters.n = 3;
  requests.push_back(letters);

  EngineRequest json = sampled_request("json", iota_prompt(8, 9), 16, 22, 0.7f);
  json.params.constraint = regex("\\{\"[a-z]+\":(true|false|null|[0-9]+)\\}");
  json.params.top_k = 12;
  json.params.repetition_penalty = 1.2f;
  requests.push_back(json);

  EngineRequest choice = sampled_request("choice", iota_prompt(5, 11), 8, 23, 1.4f);
  choice.params.constraint = regex("(yes|no|true|false)");
  choice.params.top_p = 0.8f;
  choice.params.min_tokens = 1;
  requests.push_back(choice);

  EngineRequest free_greedy = greedy_request("free_greedy", iota_prompt(9, 13), 10);
  free_greedy.params.presence_penalty = 0.5f;
  requests.push_back(free_greedy);

  EngineRequest free_sampled = sampled_request("free_sampled", iota_prompt(6, 17), 12, 24, 1.1f);
  free_sampled.params.min_p = 0.05f;
  free_sampled.n = 2;
  requests.push_back(free_sampled);
  return requests;
}

struct EngineRun {
  std::map<std::string, Collected> outputs;
  int device_rows = 0, host_rows = 0, masked_rows = 0;
};

// `requests` in one engine, submitted together (one batch), or each alone in its own engine.
EngineRun run_requests(const std::vector<EngineRequest>& requests, bool device_sampling,
                       bool together) {
  EngineRun run;
  auto run_batch = [&](const std::vector<EngineRequest>& batch) {
    MaskedSamplingRunner runner(64, 4);
    runner.set_smooth_logits(true);  // a real distribution over every id
    EngineSetup setup;
    setup.max_num_seqs = 16;
    setup.max_num_batched_tokens = 128;
    EngineConfig config = engine_config(setup);
    config.device_sampling = device_sampling;
    config.constraints = std::make_shared<const ConstraintCompiler>(toy_constraint_vocabulary());
    EngineCore engine(std::move(config), runner);
    std::map<std::string, std::unique_ptr<RequestStream>> streams;
    for (const EngineRequest& request : batch) {
      SubmitResult submitted = engine.submit(request);
      EXPECT_TRUE(submitted.accepted()) << request.request_id << ": " << submitted.message;
      streams[request.request_id] = std::move(submitted.stream);
    }
    run_until_idle(engine);
    for (auto& [id, stream] : streams) run.outputs[id] = drain(*stream);
    run.device_rows += runner.device_rows();
    run.host_rows += runner.host_rows();
    run.masked_rows += runner.masked_rows();
  };
  if (together) {
    run_batch(requests);
  } else {
    for (const EngineRequest& request : requests) run_batch({request});
  }
  return run;
}

void expect_same_outputs(const EngineRun& expected, const EngineRun& got, const char* what) {
  ASSERT_EQ(got.outputs.size(), expected.outputs.size()) << what;
  for (const auto& [id, want] : expected.outputs) {
    const Collected& have = got.outputs.at(id);
    ASSERT_EQ(have.tokens.size(), want.tokens.size()) << what << " " << id;
    for (const auto& [choice, tokens] : want.tokens) {
      EXPECT_FALSE(tokens.empty()) << what << " " << id;
      EXPECT_EQ(have.tokens.at(choice), tokens) << what << " " << id << " choice " << choice;
      EXPECT_EQ(have.last.at(choice).finish_reason, want.last.at(choice).finish_reason)
          << what << " " << id;
      EXPECT_TRUE(have.last.at(choice).error.empty())
          << what << " " << id << ": " << have.last.at(choice).error;
    }
  }
}

TEST(MaskedDeviceSampling, BatchedConstrainedAndFreeRowsGetTheirTokensAlone) {
  const std::vector<EngineRequest> requests = mixed_requests();
  const EngineRun host_alone = run_requests(requests, false, false);
  const EngineRun device_alone = run_requests(requests, true, false);
  const EngineRun device_together = run_requests(requests, true, true);
  const EngineRun host_together = run_requests(requests, false, true);
  EXPECT_EQ(host_alone.device_rows, 0);
  // Every sampling row went to the device, the constrained ones with their masks.
  EXPECT_EQ(device_together.host_rows, 0);
  EXPECT_EQ(device_alone.host_rows, 0);
  EXPECT_GT(device_together.masked_rows, 20);
  EXPECT_EQ(device_alone.masked_rows, device_together.masked_rows);  // the same tokens
  expect_same_outputs(host_alone, device_alone, "device, alone");
  expect_same_outputs(host_alone, device_together, "device, batched");
  expect_same_outputs(host_alone, host_together, "host, batched");
  // The constraint held: a seeded choice's text is one of its options.
  for (const auto& [choice, ids] : device_together.outputs.at("choice").tokens) {
    std::string text;
    for (int32_t id : ids) {
      if (id != kToyEos) text += toy_tokens().at(static_cast<size_t>(id));
    }
    EXPECT_TRUE(text == "yes" || text == "no" || text == "true" || text == "false") << text;
  }
}

// A constraint that dead-ends (after "a" the regex allows only EOS, which min_tokens blocks)
// ends its sequence alone, with the host path's error, greedy or random.
TEST(MaskedDeviceSampling, ADeadEndEndsOnlyItsSequenceWithTheHostPathsError) {
  for (const float temperature : {0.0f, 1.0f}) {
    std::map<bool, std::string> errors;
    for (const bool device : {false, true}) {
      MaskedSamplingRunner runner(64, 4);
      runner.set_smooth_logits(true);
      EngineConfig config = engine_config({});
      config.device_sampling = device;
      config.constraints = std::make_shared<const ConstraintCompiler>(toy_constraint_vocabulary());
      EngineCore engine(std::move(config), runner);
      EngineRequest victim = sampled_request("victim", iota_prompt(5, 1), 8, 3, temperature);
      victim.params.constraint = regex("a");
      victim.params.min_tokens = 4;
      SubmitResult v = engine.submit(victim);
      SubmitResult ok = engine.submit(greedy_request("ok", iota_prompt(5, 2), 8));
      ASSERT_TRUE(v.accepted() && ok.accepted());
      run_until_idle(engine);
      Collected cv = drain(*v.stream);
      Collected co = drain(*ok.stream);
      EXPECT_EQ(cv.last[0].finish_reason, FinishReason::Abort) << temperature;
      errors[device] = cv.last[0].error;
      EXPECT_EQ(co.tokens[0], reference_tokens(iota_prompt(5, 2), 8)) << temperature;
      EXPECT_EQ(co.last[0].finish_reason, FinishReason::Length) << temperature;
      EXPECT_EQ(runner.masked_rows() > 0, device);
      EXPECT_EQ(runner.host_rows() == 0, device);
    }
    EXPECT_FALSE(errors[true].empty()) << temperature;
    // The same stage and message; an internal error's location (file:line) names the code
    // that noticed, which differs between the paths.
    auto message = [](const std::string& e) { return e.substr(e.rfind(": ") + 2); };
    auto stage = [](const std::string& e) { return e.substr(0, e.find(": ")); };
    EXPECT_EQ(message(errors[true]), message(errors[false])) << temperature;
    EXPECT_EQ(stage(errors[true]), stage(errors[false])) << temperature;
  }
}

}  // namespace
}  // namespace attnres::testing
