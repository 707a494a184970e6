#include "engine/sample/sampling_params.h"

#include <cmath>
#include <sstream>

#include "engine/core/error.h"

namespace attnres {
namespace {

template <typename T>
[[noreturn]] void fail(const std::string& field, const T& got, const std::string& expected) {
  std::ostringstream msg;
  msg << "field " << field << ": got " << got << ", expected " << expected;
  throw Error(msg.str());
}

// Written as !(lo <= x && x <= hi) so that NaN is rejected too.
void check_closed(const char* field, float x, float lo, float hi) {
  if (!(lo <= x && x <= hi)) {
    std::ostringstream range;
    range << "a number in [" << lo << ", " << hi << "]";
    fail(field, x, range.str());
  }
}

}  // namespace

bool SamplingParams::greedy() const { return temperature < kGreedyTemperature; }

void SamplingParams::validate(const Vocabulary& vocabulary) const {
  check_closed("temperature", temperature, 0.0f, kMaxTemperature);
  if (!(0.0f < top_p && top_p <= 1.0f)) fail("top_p", top_p, "a number in (0, 1]");
  if (top_k < -1) fail("top_k", top_k, "-1 or 0 (disabled) or a positive integer");
  check_closed("min_p", min_p, 0.0f, 1.0f);
  if (!(0.0f < repetition_penalty && repetition_penalty <= kMaxRepetitionPenalty)) {
    std::ostringstream range;
    range << "a number in (0, " << kMaxRepetitionPenalty << "]";
    fail("repetition_penalty", repetition_penalty, range.str());
  }
  check_closed("presence_penalty", presence_penalty, -kMaxPresenceFrequencyPenalty,
               kMaxPresenceFrequencyPenalty);
  check_closed("frequency_penalty", frequency_penalty, -kMaxPresenceFrequencyPenalty,
               kMaxPresenceFrequencyPenalty);
  for (const auto& [id, bias] : logit_bias) {
    const std::string field = "logit_bias[" + std::to_string(id) + "]";
    vocabulary.check("logit_bias", id);
    check_closed(field.c_str(), bias, -kMaxLogitBias, kMaxLogitBias);
  }
  if (max_tokens < 1) fail("max_tokens", max_tokens, "an integer >= 1");
  if (min_tokens < 0 || min_tokens > max_tokens) {
    fail("min_tokens", min_tokens,
         "an integer in [0, max_tokens = " + std::to_string(max_tokens) + "]");
  }
  if (logprobs < -1 || logprobs > kMaxLogprobs) {
    fail("logprobs", logprobs, "an integer in [0, " + std::to_string(kMaxLogprobs) + "] (or none)");
  }
  if (prompt_logprobs < -1 || prompt_logprobs > kMaxLogprobs) {
    fail("prompt_logprobs", prompt_logprobs,
         "an integer in [0, " + std::to_string(kMaxLogprobs) + "] (or none)");
  }
  if (stop.size() > kMaxStopStrings) {
    fail("stop", std::to_string(stop.size()) + " strings",
         "at most " + std::to_string(kMaxStopStrings));
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) {
      fail("stop[" + std::to_string(i) + "]", "an empty string", "a non-empty string");
    }
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    vocabulary.check("stop_token_ids[" + std::to_string(i) + "]", stop_token_ids[i]);
  }
  if (allowed_token_ids.size() > kMaxAllowedTokenIds) {
    fail("allowed_token_ids", std::to_string(allowed_token_ids.size()) + " ids",
         "at most " + std::to_string(kMaxAllowedTokenIds));
  }
  for (size_t i = 0; i < allowed_token_ids.size(); ++i) {
    vocabulary.check("allowed_token_ids[" + std::to_string(i) + "]", allowed_token_ids[i]);
  }
  size_t bad_word_ids = 0;
  for (size_t i = 0; i < bad_words.size(); ++i) {
    const std::string field = "bad_words[" + std::to_string(i) + "]";
    if (bad_words[i].empty()) fail(field, "no tokens", "at least one token");
    for (int32_t id : bad_words[i]) vocabulary.check(field, id);
    bad_word_ids += bad_words[i].size();
  }
  if (bad_word_ids > kMaxBadWordTokenIds) {
    fail("bad_words", std::to_string(bad_word_ids) + " token ids",
         "at most " + std::to_string(kMaxBadWordTokenIds));
  }
}

}  // namespace attnres
