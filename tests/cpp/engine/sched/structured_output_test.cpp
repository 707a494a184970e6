// Structured output in the engine loop, over the fake model and the toy vocabulary
// (../sample/toy_constraint_vocabulary.h): constrained sequences produce only what their
// grammar allows, under seeded random sampling, n > 1, batching and preemption; unconstrained
// neighbours get exactly their tokens alone; a constraint that dead-ends ends its sequence
// alone; a spec that does not compile is refused at submit.
#include <gtest/gtest.h>

#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "../sample/toy_constraint_vocabulary.h"
#include "engine_test_util.h"

namespace attnres {
namespace {

using namespace attnres::testing;

static_assert(kToyRows == kVocab && kToyEos == kEos, "the toy vocabulary fits the fake model");

EngineConfig constrained_config(EngineSetup setup = {}) {
  EngineConfig config = engine_config(setup);
  config.constraints = std::make_shared<const ConstraintCompiler>(toy_constraint_vocabulary());
  return config;
}

OutputConstraint regex(const std::string& pattern) {
  OutputConstraint c;
  c.kind = ConstraintKind::Regex;
  c.spec = pattern;
  c.field = "guided_regex";
  return c;
}

// The text of generated ids (EOS excluded).
std::string text_of(const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) {
    if (id != kToyEos) text += toy_tokens().at(static_cast<size_t>(id));
  }
  return text;
}

TEST(StructuredOutput, SeededSamplingOnlyProducesMatchesAndEndsWithEos) {
  FakeRunner runner(64, 4);
  runner.set_smooth_logits(true);  // a real distribution over every id
  EngineCore engine(constrained_config(), runner);
  const std::regex pattern("[a-c]{2,5}");
  for (const float temperature : {0.5f, 1.0f, 2.0f}) {
    EngineRequest request = greedy_request("r", iota_prompt(6, 3), 20);
    request.params.temperature = temperature;
    request.params.seed = 11;
    request.params.constraint = regex("[a-c]{2,5}");
    request.n = 3;  // each choice its own matcher
    SubmitResult r = engine.submit(request);
    ASSERT_TRUE(r.accepted()) << r.message;
    run_until_idle(engine);
    Collected c = drain(*r.stream);
    for (int choice = 0; choice < 3; ++choice) {
      const std::vector<int32_t>& ids = c.tokens[choice];
      EXPECT_TRUE(std::regex_match(text_of(ids), pattern)) << text_of(ids);
      EXPECT_EQ(c.last[choice].finish_reason, FinishReason::Stop);
      EXPECT_TRUE(c.last[choice].error.empty()) << c.last[choice].error;
      ASSERT_FALSE(ids.empty());
      EXPECT_EQ(ids.back(), kToyEos);
    }
  }
}

// Greedy over the fake model with a constraint allowing `allowed`: the model's own token when
// allowed, else the lowest allowed id (every other logit ties at 0; argmax takes the first).
std::vector<int32_t> constrained_reference(std::vector<int32_t> prompt, int max_tokens,
                                           const std::set<int32_t>& allowed) {
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    const int32_t next = next_token(prompt);
    out.push_back(allowed.count(next) ? next : *allowed.begin());
    prompt.push_back(out.back());
  }
  return out;
}

TEST(StructuredOutput, MatchersSurvivePreemptionAndNeighboursGetTheirOwnTokens) {
  FakeRunner runner(12, 4);
  EngineCore engine(constrained_config({.num_blocks = 12, .max_num_batched_tokens = 16}), runner);
  // [0-9a]+ allows ids 0 ("a") and 26-35 ("0"-"9"); EOS only after a character, and the fake
  // model never prefers EOS, so a constrained sequence runs to max_tokens.
  std::set<int32_t> allowed = {toy_id("a")};
  for (char d = '0'; d <= '9'; ++d) allowed.insert(toy_id(std::string(1, d)));
  std::vector<std::unique_ptr<RequestStream>> streams;
  for (int i = 0; i < 8; ++i) {
    EngineRequest request = greedy_request(numbered("r", i), iota_prompt(4 + i, i), 12);
    if (i % 2 == 0) request.params.constraint = regex("[0-9a]+");
    SubmitResult r = engine.submit(std::move(request));
    ASSERT_TRUE(r.accepted()) << r.message;
    streams.push_back(std::move(r.stream));
  }
  run_until_idle(engine);
  for (int i = 0; i < 8; ++i) {
    Collected c = drain(*streams[i]);
    const std::vector<int32_t> prompt = iota_prompt(4 + i, i);
    if (i % 2 == 0) {
      EXPECT_EQ(c.tokens[0], constrained_reference(prompt, 12, allowed)) << i;
    } else {
      EXPECT_EQ(c.tokens[0], reference_tokens(prompt, 12)) << i;
    }
    EXPECT_EQ(c.last[0].finish_reason, FinishReason::Length) << c.last[0].error;
  }
  EXPECT_GT(engine.stats().preemptions_total, 0);  // the test exercised recompute
}

TEST(StructuredOutput, ADeadEndEndsOnlyItsSequence) {
  FakeRunner runner(64, 4);
  EngineCore engine(constrained_config(), runner);
  // After "a" the regex allows only EOS, which min_tokens blocks: nothing is left.
  EngineRequest victim = greedy_request("victim", iota_prompt(5, 1), 8);
  victim.params.constraint = regex("a");
  victim.params.min_tokens = 4;
  SubmitResult v = engine.submit(victim);
  SubmitResult ok = engine.submit(greedy_request("ok", iota_prompt(5, 2), 8));
  ASSERT_TRUE(v.accepted() && ok.accepted());
  run_until_idle(engine);
  Collected cv = drain(*v.stream);
  Collected co = drain(*ok.stream);
  EXPECT_EQ(cv.last[0].finish_reason, FinishReason::Abort);
  EXPECT_NE(cv.last[0].error.find("output constraint"), std::string::npos) << cv.last[0].error;
  EXPECT_EQ(co.tokens[0], reference_tokens(iota_prompt(5, 2), 8));
  EXPECT_EQ(co.last[0].finish_reason, FinishReason::Length);
}

TEST(StructuredOutput, ABadSpecIsRefusedAtSubmitNamingItsField) {
  FakeRunner runner(64, 4);
  EngineCore engine(constrained_config(), runner);
  EngineRequest request = greedy_request("r", iota_prompt(5, 1), 8);
  request.params.constraint = regex("(unclosed");
  SubmitResult r = engine.submit(request);
  EXPECT_EQ(r.status, SubmitStatus::InvalidRequest);
  EXPECT_EQ(r.message.rfind("guided_regex: invalid regex", 0), 0u) << r.message;
}

TEST(StructuredOutput, AnEngineWithoutACompilerRefusesConstraints) {
  FakeRunner runner(64, 4);
  EngineCore engine(engine_config({}), runner);
  EngineRequest request = greedy_request("r", iota_prompt(5, 1), 8);
  request.params.constraint = regex("a+");
  SubmitResult r = engine.submit(request);
  EXPECT_EQ(r.status, SubmitStatus::InvalidRequest);
  EXPECT_EQ(r.message.rfind("guided_regex: ", 0), 0u) << r.message;
}

}  // namespace
}  // namespace attnres
