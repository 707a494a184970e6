#include "engine/sample/stop_checker.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace attnres {
namespace {

constexpr int32_t kEos = 2;
constexpr int32_t kWord = 100;  // an ordinary token

SamplingParams with_stop(std::vector<std::string> stop, int max_tokens = 100) {
  SamplingParams p;
  p.stop = std::move(stop);
  p.max_tokens = max_tokens;
  return p;
}

// Feeds text chunks, one token each; returns the reason after the last chunk.
FinishReason feed(StopChecker& checker, const std::vector<std::string>& chunks, std::string& text,
                  int32_t token = kWord) {
  FinishReason reason = FinishReason::None;
  int n = 0;
  for (const auto& chunk : chunks) {
    text += chunk;
    reason = checker.check(token, ++n, text);
    if (reason != FinishReason::None) break;
  }
  return reason;
}

TEST(StopCheckerTest, StopStringAcrossTokenBoundariesIsCutAndNeverReleased) {
  StopChecker checker(with_stop({"END"}), {kEos});
  std::string text;
  EXPECT_EQ(feed(checker, {"hello E"}, text), FinishReason::None);
  EXPECT_EQ(checker.releasable_length(text), 6u);  // "E" held back
  text += "N";
  EXPECT_EQ(checker.check(kWord, 2, text), FinishReason::None);
  EXPECT_EQ(checker.releasable_length(text), 6u);  // "EN" held back
  text += "D and more";
  EXPECT_EQ(checker.check(kWord, 3, text), FinishReason::Stop);
  EXPECT_EQ(text.substr(0, checker.releasable_length(text)), "hello ");
  EXPECT_EQ(checker.matched_stop_string(), "END");
  EXPECT_EQ(checker.check(kWord, 4, text), FinishReason::Stop);  // sticky
}

TEST(StopCheckerTest, PartialPrefixReleasedOnceItDiverges) {
  StopChecker checker(with_stop({"abc"}), {kEos});
  std::string text;
  feed(checker, {"xab"}, text);
  EXPECT_EQ(checker.releasable_length(text), 1u);
  text += "x";
  EXPECT_EQ(checker.check(kWord, 2, text), FinishReason::None);
  EXPECT_EQ(checker.releasable_length(text), 4u);
}

TEST(StopCheckerTest, EarliestOfSeveralStopStringsWins) {
  StopChecker checker(with_stop({"world", "lo"}), {kEos});
  std::string text;
  EXPECT_EQ(feed(checker, {"hello world"}, text), FinishReason::Stop);
  EXPECT_EQ(text.substr(0, checker.releasable_length(text)), "hel");
  EXPECT_EQ(checker.matched_stop_string(), "lo");
}

TEST(StopCheckerTest, MaxTokensGivesLengthAndReleasesHeldText) {
  StopChecker checker(with_stop({"STOP"}, 3), {kEos});
  std::string text;
  EXPECT_EQ(feed(checker, {"a", "b", "ST"}, text), FinishReason::Length);
  EXPECT_EQ(checker.releasable_length(text), text.size());
}

TEST(StopCheckerTest, StopStringOnTheLastTokenBeatsLength) {
  StopChecker checker(with_stop({"STOP"}, 2), {kEos});
  std::string text;
  EXPECT_EQ(feed(checker, {"a", "STOP"}, text), FinishReason::Stop);
  EXPECT_EQ(checker.releasable_length(text), 1u);
}

TEST(StopCheckerTest, EosStopsAndItsTextIsDropped) {
  StopChecker checker(SamplingParams{}, {kEos});
  std::string text = "hi";
  EXPECT_EQ(checker.check(kWord, 1, text), FinishReason::None);
  text += "</s>";
  EXPECT_EQ(checker.check(kEos, 2, text), FinishReason::Stop);
  EXPECT_EQ(checker.releasable_length(text), 2u);
  EXPECT_EQ(checker.stop_token(), kEos);
}

TEST(StopCheckerTest, IncludeStopStrKeepsTheStopStringAndHoldsNothingBack) {
  SamplingParams p = with_stop({"END"});
  p.include_stop_str_in_output = true;
  StopChecker checker(p, {kEos});
  std::string text;
  EXPECT_EQ(feed(checker, {"hello E"}, text), FinishReason::None);
  EXPECT_EQ(checker.releasable_length(text), text.size());  // nothing held back
  text += "ND and more";
  EXPECT_EQ(checker.check(kWord, 2, text), FinishReason::Stop);
  EXPECT_EQ(text.substr(0, checker.releasable_length(text)), "hello END");
  EXPECT_EQ(checker.matched_stop_string(), "END");
}

TEST(StopCheckerTest, IncludeStopStrKeepsTheStopTokensText) {
  SamplingParams p;
  p.include_stop_str_in_output = true;
  p.stop_token_ids = {7};
  StopChecker checker(p, {kEos});
  std::string text = "hi";
  EXPECT_EQ(checker.check(kWord, 1, text), FinishReason::None);
  text += "<stop>";
  EXPECT_EQ(checker.check(7, 2, text), FinishReason::Stop);
  EXPECT_EQ(checker.releasable_length(text), text.size());
  EXPECT_EQ(checker.stop_token(), 7);
}

TEST(StopCheckerTest, IgnoreEosContinuesButStopTokenIdsStillStop) {
  SamplingParams p;
  p.ignore_eos = true;
  p.stop_token_ids = {7};
  StopChecker checker(p, {kEos});
  EXPECT_EQ(checker.check(kEos, 1, ""), FinishReason::None);
  EXPECT_EQ(checker.check(7, 2, ""), FinishReason::Stop);
}

TEST(StopCheckerTest, NothingStopsBeforeMinTokens) {
  SamplingParams p = with_stop({"X"}, 10);
  p.min_tokens = 3;
  p.stop_token_ids = {7};
  StopChecker checker(p, {kEos});
  std::string text = "X";
  EXPECT_EQ(checker.check(kEos, 1, text), FinishReason::None);
  EXPECT_EQ(checker.check(7, 2, text), FinishReason::None);
  text += "X";
  // vLLM: stop strings only count once more than min_tokens tokens exist.
  EXPECT_EQ(checker.check(kWord, 3, text), FinishReason::None);
  EXPECT_EQ(checker.check(kEos, 3, text), FinishReason::Stop);  // token stops from min_tokens

  StopChecker strings(p, {kEos});
  std::string t = "aaX";
  EXPECT_EQ(strings.check(kWord, 3, t), FinishReason::None);
  t += "bX";
  EXPECT_EQ(strings.check(kWord, 4, t), FinishReason::Stop);
  EXPECT_EQ(t.substr(0, strings.releasable_length(t)), "aaXb");  // early X was kept
}

TEST(StopCheckerTest, FinishReasonNames) {
  EXPECT_STREQ(finish_reason_name(FinishReason::Stop), "stop");
  EXPECT_STREQ(finish_reason_name(FinishReason::Length), "length");
  EXPECT_STREQ(finish_reason_name(FinishReason::Abort), "abort");
  EXPECT_STREQ(finish_reason_name(FinishReason::None), "");
}

// Property test against the definition: random text streamed in random chunks. The released
// text must only grow, never contain a stop string, and end as the text before the first stop.
TEST(StopCheckerTest, StreamingMatchesBruteForce) {
  const std::vector<std::string> stops = {"abca", "cc", "bab"};
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    std::string full;
    for (int i = 0; i < 40; ++i) full += "abc"[rng() % 3];
    size_t first = std::string::npos;
    for (const auto& s : stops) first = std::min(first, full.find(s));
    const std::string expected = full.substr(0, first);

    StopChecker checker(with_stop(stops, 1000), {kEos});
    std::string text, released;
    int n = 0;
    FinishReason reason = FinishReason::None;
    for (size_t pos = 0; pos < full.size() && reason == FinishReason::None;) {
      const size_t len = 1 + rng() % 4;
      text += full.substr(pos, len);
      pos += len;
      reason = checker.check(kWord, ++n, text);
      const size_t r = checker.releasable_length(text);
      ASSERT_GE(r, released.size()) << "trial " << trial;
      ASSERT_EQ(text.substr(0, released.size()), released);
      released = text.substr(0, r);
      for (const auto& s : stops) ASSERT_EQ(released.find(s), std::string::npos) << released;
    }
    if (first != std::string::npos) {
      EXPECT_EQ(reason, FinishReason::Stop);
      EXPECT_EQ(released, expected) << "trial " << trial;
    } else {
      EXPECT_EQ(expected, full);
    }
  }
}

}  // namespace
}  // namespace attnres
