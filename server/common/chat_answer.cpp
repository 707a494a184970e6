#include "server/common/chat_answer.h"

namespace attnres::server {

ChatAnswerStream::ChatAnswerStream(const ChatAnswerFormat& format, ToolCallIdMaker make_id)
    : format_(format),
      reasoning_(format.reasoning, format.prompt_thinking),
      tools_(format.tool_calls, std::move(make_id)) {}

ChatAnswerDelta ChatAnswerStream::push(std::string_view text) {
  return route(reasoning_.push(text), /*final=*/false);
}

ChatAnswerDelta ChatAnswerStream::finish() { return route(reasoning_.finish(), /*final=*/true); }

ChatAnswerDelta ChatAnswerStream::route(ReasoningDelta reasoning, bool final) {
  ChatAnswerDelta out;
  out.reasoning = std::move(reasoning.reasoning);
  ToolStreamDelta tools = tools_.push(reasoning.content);
  if (final) {
    ToolStreamDelta rest = tools_.finish();
    tools.content += rest.content;
    for (ToolCallDelta& d : rest.calls) tools.calls.push_back(std::move(d));
  }
  out.content = std::move(tools.content);
  for (ToolCallDelta& d : tools.calls) {
    if (!format_.first_call_only || d.index == 0) out.calls.push_back(std::move(d));
  }
  return out;
}

ChatAnswer parse_chat_answer(const ChatAnswerFormat& format, std::string_view text,
                             const ToolCallIdMaker& make_id) {
  ChatAnswer answer;
  if (!format.parses()) {
    answer.content = std::string(text);
    return answer;
  }
  ParsedReasoning reasoning = parse_reasoning(format.reasoning, format.prompt_thinking, text);
  answer.reasoning = std::move(reasoning.reasoning);
  ParsedToolCalls tools =
      parse_tool_calls(format.tool_calls, reasoning.content.value_or(""), make_id);
  answer.content = std::move(tools.content);
  answer.calls = std::move(tools.calls);
  if (format.first_call_only && answer.calls.size() > 1) answer.calls.resize(1);
  return answer;
}

}  // namespace attnres::server
