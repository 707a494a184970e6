#include "engine/sample/stop_checker.h"

#include <algorithm>
#include <string_view>
#include <utility>

namespace attnres {

const char* finish_reason_name(FinishReason reason) {
  switch (reason) {
    case FinishReason::Stop:
      return "stop";
    case FinishReason::Length:
      return "length";
    case FinishReason::Abort:
      return "abort";
    case FinishReason::None:
      break;
  }
  return "";
}

StopChecker::StopChecker(const SamplingParams& params, std::vector<int32_t> eos_ids)
    : stop_(params.stop),
      stop_token_ids_(params.stop_token_ids),
      eos_ids_(std::move(eos_ids)),
      ignore_eos_(params.ignore_eos),
      include_stop_str_(params.include_stop_str_in_output),
      min_tokens_(params.min_tokens),
      max_tokens_(params.max_tokens) {
  // Empty stop strings would match everywhere; validate() rejects them, and here they are
  // dropped so an unvalidated caller cannot end every sequence at once.
  std::erase_if(stop_, [](const std::string& s) { return s.empty(); });
  for (const auto& s : stop_) longest_stop_ = std::max(longest_stop_, s.size());
}

bool StopChecker::is_stop_token(int32_t token_id) const {
  auto contains = [token_id](const std::vector<int32_t>& ids) {
    return std::find(ids.begin(), ids.end(), token_id) != ids.end();
  };
  return (!ignore_eos_ && contains(eos_ids_)) || contains(stop_token_ids_);
}

std::optional<size_t> StopChecker::find_stop_string(const std::string& text, size_t* which) const {
  // A new match must end after checked_length_, so it starts at or after this point.
  const size_t new_from = std::min(checked_length_, text.size());
  std::optional<size_t> earliest;
  for (size_t i = 0; i < stop_.size(); ++i) {
    const std::string& s = stop_[i];
    const size_t from = new_from >= s.size() - 1 ? new_from - (s.size() - 1) : 0;
    const size_t pos = text.find(s, from);
    if (pos != std::string::npos && (!earliest || pos < *earliest)) {
      earliest = pos;
      *which = i;
    }
  }
  return earliest;
}

FinishReason StopChecker::check(int32_t token_id, int num_generated,
                                const std::string& text_so_far) {
  if (finish_reason_ != FinishReason::None) return finish_reason_;
  const size_t text_before_token = std::min(checked_length_, text_so_far.size());

  if (num_generated >= min_tokens_ && is_stop_token(token_id)) {
    finish_reason_ = FinishReason::Stop;
    stop_token_ = token_id;
    // vLLM does not detokenize the stop token unless include_stop_str_in_output.
    truncate_at_ = include_stop_str_ ? text_so_far.size() : text_before_token;
    return finish_reason_;
  }
  // vLLM checks stop strings only once more than min_tokens tokens exist; the search window
  // still advances meanwhile, so a stop string inside the first min_tokens tokens is kept.
  if (!stop_.empty() && num_generated > min_tokens_) {
    size_t which = 0;
    if (auto pos = find_stop_string(text_so_far, &which)) {
      finish_reason_ = FinishReason::Stop;
      matched_stop_ = stop_[which];
      truncate_at_ = include_stop_str_ ? *pos + stop_[which].size() : *pos;
      return finish_reason_;
    }
  }
  checked_length_ = text_so_far.size();
  if (num_generated >= max_tokens_) finish_reason_ = FinishReason::Length;
  return finish_reason_;
}

size_t StopChecker::releasable_length(const std::string& text_so_far) const {
  if (truncate_at_) return std::min(*truncate_at_, text_so_far.size());
  if (finish_reason_ != FinishReason::None || include_stop_str_) return text_so_far.size();
  // Hold back the longest suffix that could still grow into a stop string. Taking the longest
  // keeps the released length monotonic as text is appended.
  const std::string_view text(text_so_far);
  size_t held = 0;
  for (const auto& s : stop_) {
    for (size_t len = std::min(s.size() - 1, text.size()); len > held; --len) {
      if (text.substr(text.size() - len) == std::string_view(s).substr(0, len)) {
        held = len;
        break;
      }
    }
  }
  return text.size() - held;
}

}  // namespace attnres
