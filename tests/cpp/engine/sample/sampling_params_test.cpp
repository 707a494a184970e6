#include "engine/sample/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "engine/core/error.h"

namespace attnres {
namespace {

constexpr int kVocab = 1000;

// The validate() message for params changed by `edit`, or "" when they are valid.
std::string error_for(const std::function<void(SamplingParams&)>& edit,
                      Vocabulary vocabulary = Vocabulary::all_rows(kVocab)) {
  SamplingParams p;
  edit(p);
  try {
    p.validate(vocabulary);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A model whose LM head has rows past the tokenizer (ids [900, 1000) are padding): ids there
// can never be produced, so no request field may name them.
TEST(SamplingParamsTest, PaddingRowsAreRefusedByName) {
  const Vocabulary padded = Vocabulary::of(kVocab, 900);
  const std::string padding_note =
      " (token id 950 is a padding row of the model's vocabulary of 1000: the tokenizer has no "
      "token for it)";
  EXPECT_EQ(error_for([](SamplingParams& p) { p.logit_bias = {{950, 100.0f}}; }, padded),
            "field logit_bias: got 950, expected a token id in [0, 900)" + padding_note);
  EXPECT_EQ(error_for([](SamplingParams& p) { p.allowed_token_ids = {3, 950}; }, padded),
            "field allowed_token_ids[1]: got 950, expected a token id in [0, 900)" + padding_note);
  EXPECT_EQ(error_for([](SamplingParams& p) { p.stop_token_ids = {950}; }, padded),
            "field stop_token_ids[0]: got 950, expected a token id in [0, 900)" + padding_note);
  EXPECT_EQ(error_for([](SamplingParams& p) { p.allowed_token_ids = {1000}; }, padded),
            "field allowed_token_ids[0]: got 1000, expected a token id in [0, 1000)");
  EXPECT_EQ(error_for([](SamplingParams& p) {
              p.logit_bias = {{899, 100.0f}};
              p.allowed_token_ids = {0, 899};
            }, padded),
            "");
}

TEST(SamplingParamsTest, DefaultsAreValid) {
  EXPECT_EQ(error_for([](SamplingParams&) {}), "");
}

TEST(SamplingParamsTest, BoundaryValuesAreValid) {
  EXPECT_EQ(error_for([](SamplingParams& p) {
              p.temperature = 0.0f;
              p.top_p = 1e-6f;
              p.top_k = -1;
              p.min_p = 1.0f;
              p.repetition_penalty = 100.0f;
              p.presence_penalty = -2.0f;
              p.frequency_penalty = 2.0f;
              p.logit_bias = {{0, -100.0f}, {kVocab - 1, 100.0f}};
              p.max_tokens = 1;
              p.min_tokens = 1;
              p.logprobs = 20;
              p.stop = {"x"};
              p.stop_token_ids = {kVocab - 1};
            }),
            "");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.top_k = 5000; }), "");  // > vocab: off
  EXPECT_EQ(error_for([](SamplingParams& p) { p.logprobs = 0; }), "");
}

TEST(SamplingParamsTest, MessagesNameFieldValueAndRange) {
  EXPECT_EQ(error_for([](SamplingParams& p) { p.temperature = -1.0f; }),
            "field temperature: got -1, expected a number in [0, 100]");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.temperature = NAN; }),
            "field temperature: got nan, expected a number in [0, 100]");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.top_p = 0.0f; }),
            "field top_p: got 0, expected a number in (0, 1]");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.top_p = 1.5f; }),
            "field top_p: got 1.5, expected a number in (0, 1]");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.top_k = -2; }),
            "field top_k: got -2, expected -1 or 0 (disabled) or a positive integer");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.min_p = 1.5f; }),
            "field min_p: got 1.5, expected a number in [0, 1]");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.repetition_penalty = 0.0f; }),
            "field repetition_penalty: got 0, expected a number in (0, 100]");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.presence_penalty = 2.5f; }),
            "field presence_penalty: got 2.5, expected a number in [-2, 2]");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.frequency_penalty = -3.0f; }),
            "field frequency_penalty: got -3, expected a number in [-2, 2]");
  EXPECT_EQ(error_for([](SamplingParams& p) {
              p.logit_bias = {{kVocab, 1.0f}};
            }),
            "field logit_bias: got 1000, expected a token id in [0, 1000)");
  EXPECT_EQ(error_for([](SamplingParams& p) {
              p.logit_bias = {{-1, 1.0f}};
            }),
            "field logit_bias: got -1, expected a token id in [0, 1000)");
  EXPECT_EQ(error_for([](SamplingParams& p) {
              p.logit_bias = {{7, 101.0f}};
            }),
            "field logit_bias[7]: got 101, expected a number in [-100, 100]");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.max_tokens = 0; }),
            "field max_tokens: got 0, expected an integer >= 1");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.min_tokens = 17; }),
            "field min_tokens: got 17, expected an integer in [0, max_tokens = 16]");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.min_tokens = -1; }),
            "field min_tokens: got -1, expected an integer in [0, max_tokens = 16]");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.logprobs = 21; }),
            "field logprobs: got 21, expected an integer in [0, 20] (or none)");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.logprobs = -2; }),
            "field logprobs: got -2, expected an integer in [0, 20] (or none)");
  EXPECT_EQ(error_for([](SamplingParams& p) {
              p.stop = {"a", ""};
            }),
            "field stop[1]: got an empty string, expected a non-empty string");
  EXPECT_EQ(error_for([](SamplingParams& p) { p.stop.assign(17, "x"); }),
            "field stop: got 17 strings, expected at most 16");
  EXPECT_EQ(error_for([](SamplingParams& p) {
              p.stop_token_ids = {1, kVocab};
            }),
            "field stop_token_ids[1]: got 1000, expected a token id in [0, 1000)");
}

TEST(SamplingParamsTest, GreedyBelowVllmEpsilon) {
  SamplingParams p;
  p.temperature = 0.0f;
  EXPECT_TRUE(p.greedy());
  p.temperature = 0.9e-5f;
  EXPECT_TRUE(p.greedy());
  p.temperature = 1e-4f;
  EXPECT_FALSE(p.greedy());
}

}  // namespace
}  // namespace attnres
