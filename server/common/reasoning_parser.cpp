#include "server/common/reasoning_parser.h"

#include <algorithm>

namespace attnres::server {
namespace {

// The length of the longest end of `text` that is a proper start of `marker`: text that may
// become the marker once more arrives.
size_t marker_prefix_at_end(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

std::optional<ReasoningFormat> reasoning_format_from_name(std::string_view name) {
  if (name == "qwen3") return ReasoningFormat::Qwen3;
  if (name == "deepseek_r1") return ReasoningFormat::DeepSeekR1;
  if (name == "none") return ReasoningFormat::None;
  return std::nullopt;
}

const char* reasoning_format_name(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::Qwen3:
      return "qwen3";
    case ReasoningFormat::DeepSeekR1:
      return "deepseek_r1";
    case ReasoningFormat::None:
      break;
  }
  return "none";
}

ReasoningFormat detect_reasoning_format(std::string_view chat_template) {
  if (chat_template.find(kThinkStart) == std::string_view::npos) return ReasoningFormat::None;
  if (chat_template.find("<｜Assistant｜>") != std::string_view::npos) {
    return ReasoningFormat::DeepSeekR1;
  }
  return ReasoningFormat::Qwen3;
}

PromptThinking prompt_thinking(std::string_view prompt_text) {
  const size_t open = prompt_text.rfind(kThinkStart);
  const size_t close = prompt_text.rfind(kThinkEnd);
  if (open == std::string_view::npos && close == std::string_view::npos) {
    return PromptThinking::Unopened;
  }
  if (close == std::string_view::npos) return PromptThinking::Open;
  if (open == std::string_view::npos) return PromptThinking::Closed;
  return open > close ? PromptThinking::Open : PromptThinking::Closed;
}

ReasoningStreamParser::ReasoningStreamParser(ReasoningFormat format, PromptThinking prompt)
    : format_(format), prompt_open_(prompt == PromptThinking::Open), state_(State::Start) {
  if (format == ReasoningFormat::None || prompt == PromptThinking::Closed) state_ = State::Content;
}

ReasoningDelta ReasoningStreamParser::push(std::string_view text) {
  pending_ += text;
  return consume(/*final=*/false);
}

ReasoningDelta ReasoningStreamParser::finish() { return consume(/*final=*/true); }

ReasoningDelta ReasoningStreamParser::consume(bool final) {
  ReasoningDelta out;
  if (state_ == State::Start) {
    // A leading <think> opens reasoning (and is not part of it); without one, Qwen3 starts in
    // content unless the prompt left thinking open, DeepSeek-R1 always starts in reasoning.
    std::string_view view = pending_;
    if (!final && view.size() < kThinkStart.size() && kThinkStart.substr(0, view.size()) == view) {
      return out;  // may still become <think>
    }
    if (view.substr(0, kThinkStart.size()) == kThinkStart) {
      pending_.erase(0, kThinkStart.size());
      state_ = State::Reasoning;
    } else {
      state_ = format_ == ReasoningFormat::DeepSeekR1 || prompt_open_ ? State::Reasoning
                                                                      : State::Content;
    }
  }
  if (state_ == State::Reasoning) {
    reasoning_seen_ = true;
    const size_t end = pending_.find(kThinkEnd);
    if (end == std::string::npos) {
      const size_t hold = final ? 0 : marker_prefix_at_end(pending_, kThinkEnd);
      out.reasoning = pending_.substr(0, pending_.size() - hold);
      pending_.erase(0, pending_.size() - hold);
      return out;
    }
    out.reasoning = pending_.substr(0, end);
    pending_.erase(0, end + kThinkEnd.size());
    state_ = State::Content;
  }
  out.content += pending_;
  pending_.clear();
  return out;
}

ParsedReasoning parse_reasoning(ReasoningFormat format, PromptThinking prompt,
                                std::string_view text) {
  ReasoningStreamParser parser(format, prompt);
  ReasoningDelta a = parser.push(text);
  ReasoningDelta b = parser.finish();
  ParsedReasoning parsed;
  const bool had_reasoning = format != ReasoningFormat::None && parser.reasoning_seen();
  if (had_reasoning) parsed.reasoning = a.reasoning + b.reasoning;
  std::string content = a.content + b.content;
  if (!content.empty()) parsed.content = std::move(content);
  return parsed;
}

}  // namespace attnres::server
