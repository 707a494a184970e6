// Fault isolation (docs/ENGINE_CONTRACT.md): whatever goes wrong in one sequence's output
// path ends that sequence, with its error, and nothing else. Padding rows of the vocabulary
// (ids the tokenizer cannot decode) are never sampled and never accepted in a request. Each
// test runs victims beside innocent requests and checks that the innocents get exactly the
// tokens they get alone (reference_tokens), that the engine stays alive, and that no KV block
// is left behind.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "engine/sched/offline_generator.h"
#include "engine_test_util.h"

namespace attnres::testing {
namespace {

constexpr int kDecodable = 40;  // ids [40, 64) are the fake model's padding rows

// Greedy decoding of the fake model with the padding rows removed, written out on the plain
// token list: the argmax (lowest id among equals) of the row over the decodable ids only.
std::vector<int32_t> masked_reference(const FakeRunner& runner, std::vector<int32_t> context,
                                      int max_tokens) {
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    const std::vector<float> row = runner.logits_for(next_token(context));
    int32_t next = 0;
    for (int32_t v = 1; v < kDecodable; ++v) next = row[v] > row[next] ? v : next;
    context.push_back(next);
    out.push_back(next);
  }
  return out;
}

EngineConfig padded_config() {
  EngineConfig config = engine_config({});
  config.vocabulary = Vocabulary::of(kVocab, kDecodable);
  config.eos_ids = {};  // kEos (63) is a padding row here
  return config;
}

std::vector<int32_t> prompt_of(int length, int32_t first) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < length; ++i) prompt.push_back((first + 3 * i) % kDecodable);
  return prompt;
}

TEST(FaultIsolation, PaddingRowsAreNeverSampledEvenWhenTheyWouldWin) {
  FakeRunner runner(128, 4);
  runner.set_smooth_logits(true);
  // A padding id that beats every real token, in every row (a trained model's padding rows
  // are small, but random weights or a bad checkpoint are not).
  runner.set_row_editor([](const std::vector<int32_t>&, std::span<float> row) { row[50] = 100; });
  EngineCore engine(padded_config(), runner);
  SubmitResult greedy = engine.submit(greedy_request("greedy", prompt_of(6, 1), 20));
  EngineRequest sampled = greedy_request("sampled", prompt_of(5, 2), 20);
  sampled.params.temperature = 1.0f;
  sampled.params.seed = 7;
  sampled.params.logprobs = 5;
  sampled.n = 4;
  SubmitResult random = engine.submit(sampled);
  ASSERT_TRUE(greedy.accepted() && random.accepted());
  run_until_idle(engine);

  Collected g = drain(*greedy.stream);
  EXPECT_EQ(g.tokens[0], masked_reference(runner, prompt_of(6, 1), 20));
  EXPECT_EQ(g.last[0].finish_reason, FinishReason::Length);
  Collected r = drain(*random.stream);
  for (int choice = 0; choice < 4; ++choice) {
    ASSERT_EQ(r.tokens[choice].size(), 20u);
    for (int32_t t : r.tokens[choice]) EXPECT_LT(t, kDecodable);
    EXPECT_TRUE(r.last[choice].error.empty()) << r.last[choice].error;
  }
  EXPECT_TRUE(engine.stats().alive);
}

TEST(FaultIsolation, LogprobsNeverNamePaddingRows) {
  FakeRunner runner(64, 4);
  runner.set_smooth_logits(true);
  runner.set_row_editor([](const std::vector<int32_t>&, std::span<float> row) { row[45] = 50; });
  EngineCore engine(padded_config(), runner);
  EngineRequest request = greedy_request("r", prompt_of(5, 1), 6);
  request.params.logprobs = 20;
  SubmitResult r = engine.submit(request);
  run_until_idle(engine);
  std::vector<TokenLogprob> seen;
  while (std::optional<RequestOutput> out = r.stream->next()) {
    for (const TokenLogprob& lp : out->logprobs) {
      EXPECT_TRUE(std::isfinite(lp.logprob));
      for (const auto& [id, value] : lp.top) EXPECT_LT(id, kDecodable);
      seen.push_back(lp);
    }
  }
  EXPECT_EQ(seen.size(), 6u);
}

TEST(FaultIsolation, RequestsNamingPaddingIdsAreRefusedWithTheIdNamed) {
  FakeRunner runner(64, 4);
  EngineCore engine(padded_config(), runner);
  EngineRequest bias = greedy_request("bias", prompt_of(5, 1), 2);
  bias.params.logit_bias = {{50, 100.0f}};
  SubmitResult a = engine.submit(bias);
  EXPECT_EQ(a.status, SubmitStatus::InvalidRequest);
  EXPECT_NE(a.message.find("field logit_bias: got 50"), std::string::npos) << a.message;
  EXPECT_NE(a.message.find("padding row"), std::string::npos) << a.message;

  EngineRequest allowed = greedy_request("allowed", prompt_of(5, 1), 2);
  allowed.params.allowed_token_ids = {1, 2, 41};
  SubmitResult b = engine.submit(allowed);
  EXPECT_EQ(b.status, SubmitStatus::InvalidRequest);
  EXPECT_NE(b.message.find("field allowed_token_ids[2]: got 41"), std::string::npos) << b.message;

  SubmitResult c = engine.submit(greedy_request("prompt", {1, 2, 60, 3}, 2));
  EXPECT_EQ(c.status, SubmitStatus::InvalidRequest);
  EXPECT_NE(c.message.find("field prompt[2]: got 60"), std::string::npos) << c.message;
  EXPECT_TRUE(engine.stats().alive);
}

TEST(FaultIsolation, AllowedTokenIdsRestrictSampling) {
  FakeRunner runner(64, 4);
  runner.set_smooth_logits(true);
  EngineCore engine(padded_config(), runner);
  EngineRequest request = greedy_request("r", prompt_of(5, 1), 12);
  request.params.temperature = 1.0f;
  request.params.seed = 3;
  request.params.allowed_token_ids = {5, 7, 11};
  SubmitResult r = engine.submit(request);
  run_until_idle(engine);
  Collected c = drain(*r.stream);
  ASSERT_EQ(c.tokens[0].size(), 12u);
  for (int32_t t : c.tokens[0]) EXPECT_TRUE(t == 5 || t == 7 || t == 11) << t;
}

// Victims and innocents run together; the hook fails the victim at one stage, after a few
// tokens for the per-token stages.
struct StageCase {
  OutputStage stage;
  int fail_on_call;  // the victim's n-th visit of the stage (0 = the first)
};

class FaultAtStage : public ::testing::TestWithParam<StageCase> {};

TEST_P(FaultAtStage, EndsOnlyItsOwnSequence) {
  const StageCase param = GetParam();
  FakeRunner runner(64, 4);
  runner.set_allow_inner_rows(true);  // prompt logprobs
  runner.set_depth_layout(2, 3);
  EngineConfig config = engine_config({.max_num_batched_tokens = 8});  // chunked prefill
  int visits = 0;
  config.output_fault_hook = [&](OutputStage stage, std::string_view request_id) {
    if (request_id != "victim" || stage != param.stage) return;
    if (visits++ == param.fail_on_call) throw std::runtime_error("injected fault");
  };
  EngineCore engine(config, runner);

  // The victim asks for everything, so every stage runs for it.
  EngineRequest victim = greedy_request("victim", iota_prompt(11, 1), 10);
  victim.params.prompt_logprobs = 2;
  victim.params.logprobs = 2;
  victim.params.depth_attention_per_token = true;
  victim.params.stop = {"never"};
  SubmitResult v = engine.submit(victim);
  SubmitResult a = engine.submit(greedy_request("a", iota_prompt(7, 2), 10));
  EngineRequest fan_out = greedy_request("b", iota_prompt(9, 3), 10);
  fan_out.n = 2;
  fan_out.params.depth_attention = true;
  SubmitResult b = engine.submit(fan_out);
  ASSERT_TRUE(v.accepted() && a.accepted() && b.accepted());
  run_until_idle(engine);

  Collected cv = drain(*v.stream);
  EXPECT_EQ(cv.last[0].finish_reason, FinishReason::Abort);
  const std::string stage = output_stage_name(param.stage);
  EXPECT_NE(cv.last[0].error.find(stage + " failed: injected fault"), std::string::npos)
      << cv.last[0].error;
  EXPECT_TRUE(cv.nothing_after_finish);
  EXPECT_TRUE(v.stream->ended());

  Collected ca = drain(*a.stream);
  EXPECT_EQ(ca.tokens[0], reference_tokens(iota_prompt(7, 2), 10));
  EXPECT_EQ(ca.last[0].finish_reason, FinishReason::Length);
  Collected cb = drain(*b.stream);
  for (int choice = 0; choice < 2; ++choice) {
    EXPECT_EQ(cb.tokens[choice], reference_tokens(iota_prompt(9, 3), 10));
    EXPECT_TRUE(cb.last[choice].error.empty());
  }

  // The engine is alive, holds no block of the victim, and serves the next request.
  const EngineStats stats = engine.stats();
  EXPECT_TRUE(stats.alive);
  EXPECT_EQ(stats.kv_cache_usage, 0.0);
  EXPECT_EQ(stats.finished_abort, 1);
  SubmitResult after = engine.submit(greedy_request("after", iota_prompt(5, 4), 4));
  ASSERT_TRUE(after.accepted());
  run_until_idle(engine);
  EXPECT_EQ(drain(*after.stream).tokens[0], reference_tokens(iota_prompt(5, 4), 4));
}

INSTANTIATE_TEST_SUITE_P(
    EveryStage, FaultAtStage,
    ::testing::Values(StageCase{OutputStage::PromptLogprobs, 1},
                      StageCase{OutputStage::DepthAttention, 0},
                      StageCase{OutputStage::DepthAttention, 4},
                      StageCase{OutputStage::CheckLogits, 3},
                      StageCase{OutputStage::Sample, 0}, StageCase{OutputStage::Sample, 5},
                      StageCase{OutputStage::Detokenize, 2}, StageCase{OutputStage::StopCheck, 6}),
    [](const ::testing::TestParamInfo<StageCase>& info) {
      std::string name = output_stage_name(info.param.stage);
      std::erase(name, ' ');
      return name + "_visit" + std::to_string(info.param.fail_on_call);
    });

TEST(FaultIsolation, NonFiniteLogitsEndOnlyTheirSequence) {
  for (const float poison : {std::numeric_limits<float>::quiet_NaN(),
                             std::numeric_limits<float>::infinity()}) {
    FakeRunner runner(64, 4);
    // The model breaks for sequences whose prompt starts with token 9, after 3 tokens.
    runner.set_row_editor([&](const std::vector<int32_t>& context, std::span<float> row) {
      if (context.front() == 9 && context.size() >= 8) row[3] = poison;
    });
    EngineCore engine(engine_config({}), runner);
    SubmitResult bad = engine.submit(greedy_request("bad", iota_prompt(5, 9), 10));
    SubmitResult good = engine.submit(greedy_request("good", iota_prompt(5, 1), 10));
    run_until_idle(engine);
    Collected cb = drain(*bad.stream);
    EXPECT_EQ(cb.tokens[0].size(), 3u);
    EXPECT_EQ(cb.last[0].finish_reason, FinishReason::Abort);
    EXPECT_NE(cb.last[0].error.find("logits check failed: the model produced a non-finite logit"),
              std::string::npos)
        << cb.last[0].error;
    EXPECT_EQ(drain(*good.stream).tokens[0], reference_tokens(iota_prompt(5, 1), 10));
    EXPECT_TRUE(engine.stats().alive);
    EXPECT_EQ(engine.stats().kv_cache_usage, 0.0);
  }
}

// attnres generate / bench latency step the server's engine through the offline generator, so a
// failing sequence ends there exactly as a server request's choice would.
TEST(FaultIsolation, TheOfflineGeneratorEndsOnlyTheFailingSequence) {
  FakeRunner runner(64, 4);
  runner.set_row_editor([](const std::vector<int32_t>&, std::span<float> row) { row[50] = 100; });
  OfflineGeneratorOptions options;
  options.num_kv_blocks = 64;
  options.block_size = 4;
  options.max_model_len = 64;
  // No tokenizer: the vocabulary is every row, so mask with the hook-free path only; the
  // padding case is covered by the engine tests above.
  OfflineGenerator generator(runner, nullptr, {}, options);
  generator.set_output_fault_hook([](OutputStage stage, std::string_view id) {
    if (id == "1" && stage == OutputStage::StopCheck) throw std::runtime_error("injected fault");
  });
  std::vector<GenerationRequest> requests(3);
  for (int i = 0; i < 3; ++i) {
    requests[i].prompt_ids = iota_prompt(5, 1 + i);
    requests[i].params.temperature = 0.0f;
    requests[i].params.max_tokens = 6;
  }
  const std::vector<GenerationResult> results = generator.generate(requests);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_EQ(results[1].finish_reason, FinishReason::Abort);
  EXPECT_NE(results[1].error.find("stop check failed: injected fault"), std::string::npos);
  // The stop check of its first token failed, so that token was never delivered (a server
  // client gets no token either, only the error).
  EXPECT_TRUE(results[1].token_ids.empty());
  for (int i : {0, 2}) {
    EXPECT_TRUE(results[i].error.empty());
    EXPECT_EQ(results[i].finish_reason, FinishReason::Length);
    EXPECT_EQ(results[i].token_ids.size(), 6u);
    for (int32_t t : results[i].token_ids) EXPECT_EQ(t, 50);  // every row: 50 wins
  }
}

}  // namespace
}  // namespace attnres::testing
