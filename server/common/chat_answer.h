// A chat answer's text split into reasoning, content and tool calls: the reasoning parser runs
// first, the tool-call parser over what follows the reasoning (tool calls come after the
// thinking, as in vLLM). Streamed and whole answers go through the same parsers.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/common/reasoning_parser.h"
#include "server/common/tool_call_parser.h"

namespace attnres::server {

struct ChatAnswerFormat {
  ReasoningFormat reasoning = ReasoningFormat::None;
  PromptThinking prompt_thinking = PromptThinking::Unopened;  // of the rendered prompt
  ToolCallFormat tool_calls = ToolCallFormat::None;           // None: calls are not parsed
  // parallel_tool_calls: false keeps only the first call the model writes (the later ones are
  // dropped, not turned into content).
  bool first_call_only = false;

  bool parses() const {
    return reasoning != ReasoningFormat::None || tool_calls != ToolCallFormat::None;
  }
};

struct ChatAnswerDelta {
  std::string reasoning;
  std::string content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

class ChatAnswerStream {
 public:
  explicit ChatAnswerStream(const ChatAnswerFormat& format,
                            ToolCallIdMaker make_id = random_tool_call_id);
  ChatAnswerDelta push(std::string_view text);
  ChatAnswerDelta finish();
  bool made_calls() const { return tools_.calls_started() > 0; }

 private:
  ChatAnswerDelta route(ReasoningDelta reasoning, bool final);

  ChatAnswerFormat format_;
  ReasoningStreamParser reasoning_;
  ToolCallStreamParser tools_;
};

struct ChatAnswer {
  std::optional<std::string> reasoning;  // nullopt: no reasoning
  std::optional<std::string> content;    // nullopt: none (when a parser ran and found none)
  std::vector<ToolCall> calls;
};
ChatAnswer parse_chat_answer(const ChatAnswerFormat& format, std::string_view text,
                             const ToolCallIdMaker& make_id = random_tool_call_id);

}  // namespace attnres::server
