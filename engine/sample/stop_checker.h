// Decides when a sequence ends and how much of its text may be released to a streaming client,
// with OpenAI / vLLM semantics: stop strings and stop tokens are not part of the output (unless
// include_stop_str_in_output).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "engine/sample/sampling_params.h"

namespace attnres {

enum class FinishReason { None, Stop, Length, Abort };

// "stop" / "length" / "abort" (the OpenAI finish_reason strings); None gives "".
const char* finish_reason_name(FinishReason reason);

// With include_stop_str_in_output the stop string (or stop token's text) stays at the end of
// the text instead, and nothing is held back while running: text released before a stop string
// completes is part of the output either way.
//
// One per sequence. Assumes the detokenized text only grows by appending (incremental
// detokenizers hold back incomplete UTF-8, so this holds).
class StopChecker {
 public:
  StopChecker(const SamplingParams& params, std::vector<int32_t> eos_ids);

  // Called after each generated token with that token, the number of tokens generated so far
  // (this one included) and the full text generated so far (this token's text included).
  // Order, as vLLM: nothing token-based stops before min_tokens tokens; then EOS (unless
  // ignore_eos) or a stop_token_id => Stop (the token's text is dropped); then a stop string
  // completed in the new text => Stop (text truncated before it; only once more than
  // min_tokens tokens exist); then num_generated >= max_tokens => Length. Once finished, the
  // same reason is returned again.
  FinishReason check(int32_t token_id, int num_generated, const std::string& text_so_far);

  // Length of the prefix of text_so_far that is final: while running, everything but the
  // longest suffix that is a proper prefix of some stop string (so streamed text never
  // contains a stop string; everything with include_stop_str_in_output); after a stop string
  // or stop token, the truncation point; after any other finish, everything.
  size_t releasable_length(const std::string& text_so_far) const;

  FinishReason finish_reason() const { return finish_reason_; }
  // What stopped the sequence (vLLM's stop_reason): the stop string or the stop token id.
  const std::optional<std::string>& matched_stop_string() const { return matched_stop_; }
  std::optional<int32_t> stop_token() const { return stop_token_; }

 private:
  bool is_stop_token(int32_t token_id) const;
  // Earliest position of any stop string in text, searching only where a match could end in
  // the text appended since the last check.
  std::optional<size_t> find_stop_string(const std::string& text, size_t* which) const;

  std::vector<std::string> stop_;
  std::vector<int32_t> stop_token_ids_;
  std::vector<int32_t> eos_ids_;
  bool ignore_eos_;
  bool include_stop_str_;
  int min_tokens_;
  int max_tokens_;
  size_t longest_stop_ = 0;

  size_t checked_length_ = 0;  // text length at the previous check
  FinishReason finish_reason_ = FinishReason::None;
  std::optional<size_t> truncate_at_;
  std::optional<std::string> matched_stop_;
  std::optional<int32_t> stop_token_;
};

}  // namespace attnres
