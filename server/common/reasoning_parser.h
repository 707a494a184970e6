// A reasoning model's thinking out of its text: <think> ... </think> becomes reasoning, the
// rest content (vLLM's --reasoning-parser names):
//   qwen3        Qwen3: reasoning when the answer opens <think> or the prompt left one open
//                (a thinking template that writes "<think>\n" into the prompt); a prompt that
//                already closed it (enable_thinking=false renders "<think>\n\n</think>") makes
//                everything content.
//   deepseek_r1  DeepSeek-R1: the answer starts inside reasoning (its template opens it)
//                unless the prompt closed it; a leading <think> is dropped.
// Reasoning that never closes stays reasoning to the end. As for tool calls, one incremental
// parser serves streamed and whole answers alike.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace attnres::server {

enum class ReasoningFormat { None, Qwen3, DeepSeekR1 };

// "qwen3" / "deepseek_r1" / "none"; nullopt for another name.
std::optional<ReasoningFormat> reasoning_format_from_name(std::string_view name);
const char* reasoning_format_name(ReasoningFormat format);
// From a chat template's text: DeepSeekR1 for a template with <think> and DeepSeek's
// <｜Assistant｜> marker, Qwen3 for another with <think>, None otherwise.
ReasoningFormat detect_reasoning_format(std::string_view chat_template);

inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

// Where a prompt leaves thinking: Open (its last marker is <think>), Closed (</think>), or
// Unopened (no marker).
enum class PromptThinking { Unopened, Open, Closed };
PromptThinking prompt_thinking(std::string_view prompt_text);

struct ReasoningDelta {
  std::string reasoning;
  std::string content;
  bool empty() const { return reasoning.empty() && content.empty(); }
};

class ReasoningStreamParser {
 public:
  ReasoningStreamParser(ReasoningFormat format, PromptThinking prompt);

  // Feeds the next piece of the answer; a possible marker prefix at the end is held back.
  ReasoningDelta push(std::string_view text);
  // The answer ended: releases what was held back.
  ReasoningDelta finish();
  // Whether the answer is past its reasoning (content from here on).
  bool reasoning_ended() const { return state_ == State::Content; }
  // Whether the answer had a reasoning part (even an empty one).
  bool reasoning_seen() const { return reasoning_seen_; }

 private:
  enum class State { Start, Reasoning, Content };
  ReasoningDelta consume(bool final);

  ReasoningFormat format_;
  bool prompt_open_;
  State state_;
  bool reasoning_seen_ = false;
  std::string pending_;  // text not yet released
};

// A whole answer: reasoning (nullopt when there was none) and content (nullopt when empty).
struct ParsedReasoning {
  std::optional<std::string> reasoning;
  std::optional<std::string> content;
};
ParsedReasoning parse_reasoning(ReasoningFormat format, PromptThinking prompt,
                                std::string_view text);

}  // namespace attnres::server
