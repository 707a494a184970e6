// One answer's output items, built as its text arrives: the reasoning parser first, the
// tool-call parser over what follows the reasoning (as the chat request's ChatAnswerFormat
// says; None leaves it unparsed), and each part goes to the item it belongs to: <think> text
// to a reasoning item, content to a message item, each call to a function_call item (its id and
// name first, then its arguments). An item ends when the next one begins. With an event writer
// every change is also sent as the Responses events; a whole answer is the same pushes without
// events, so a stream's items are the whole answer's by construction.
//
// Whitespace alone does not open a message: text before the first visible character is held
// and goes to the message if one opens, and is dropped if the answer turns out to be only
// calls. An answer with no items at all gets one (possibly empty) message.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "server/common/chat_answer.h"
#include "server/http/responses_output.h"

namespace attnres::server::http {

class ResponseItemBuilder {
 public:
  // `events`: null to build the items only. `max_calls`: calls past it are dropped
  // (parallel_tool_calls false: 1; max_tool_calls).
  ResponseItemBuilder(const ChatAnswerFormat& formats, ItemIdMaker ids, ResponseEventWriter* events,
                      int max_calls);

  void push(std::string_view text);
  // Ends the answer: releases what the parsers held back and ends the last item, whose
  // status is "incomplete" when `incomplete` (the token budget cut it). Returns every item.
  Json finish(bool incomplete);

  // The reasoning text of all reasoning items (for usage.reasoning_tokens).
  const std::string& reasoning_text() const { return reasoning_text_; }

 private:
  enum class Kind { None, Reasoning, Message, Call };
  void route(std::string reasoning, std::string content, std::vector<ToolCallDelta> calls);
  void on_reasoning(const std::string& text);
  void on_content(const std::string& text);
  void on_call(const ToolCallDelta& delta);
  void open(Kind kind, Json item);
  void close(const char* status);

  ChatAnswerFormat formats_;
  ItemIdMaker ids_;
  ResponseEventWriter* events_;
  int max_calls_;
  std::optional<ReasoningStreamParser> reasoning_;
  std::optional<ToolCallStreamParser> tools_;

  Json items_ = Json::array();  // ended items
  Kind kind_ = Kind::None;      // of the open item
  Json open_;                   // the open item as it stands
  int open_call_ = -1;          // the parser's index of the open call
  std::string held_space_;      // content whitespace not yet in a message
  std::string reasoning_text_;
};

}  // namespace attnres::server::http
