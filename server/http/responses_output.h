// POST /v1/responses' answers in the OpenAI Responses shapes: the output items (reasoning,
// message, function_call), the response object, its usage, and the server-sent events of a
// streamed response ("event: <type>" + "data: <json>", each with a sequence_number).
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "engine/sched/request_stream.h"
#include "server/common/reasoning_parser.h"
#include "server/common/tool_call_parser.h"

namespace attnres::server::http {

using Json = nlohmann::ordered_json;

// One generated answer, split into its parts.
struct AssistantTurn {
  std::string reasoning;        // empty: no reasoning item
  std::string content;          // empty with calls: no message item
  std::vector<ToolCall> calls;  // each call's id is its call_id
};

// How answers split: the reasoning and tool-call syntaxes of the model's chat template (None:
// not parsed) and where the rendered prompt left thinking.
struct AnswerFormats {
  ReasoningFormat reasoning = ReasoningFormat::None;
  PromptThinking prompt_thinking = PromptThinking::Unopened;
  ToolCallFormat tool_calls = ToolCallFormat::None;
  bool parses() const {
    return reasoning != ReasoningFormat::None || tool_calls != ToolCallFormat::None;
  }
};

// The reasoning parser first, then the tool-call parser over what follows the reasoning.
AssistantTurn split_answer(const AnswerFormats& formats, std::string_view text);

// Makes "<prefix>_<hex>" ids ("msg", "fc", "call", "rs").
using ItemIdMaker = std::function<std::string(std::string_view prefix)>;

Json reasoning_item(const std::string& id, const std::string& text);
Json message_item(const std::string& id, const std::string& text, const char* status);
Json function_call_item(const std::string& id, const ToolCall& call, const char* status);

// The turn's items in order: reasoning, message (when there is content, or nothing else),
// function calls. `incomplete` (the token budget ended it) marks the message incomplete.
Json output_items(const AssistantTurn& turn, bool incomplete, const ItemIdMaker& ids);

// {input_tokens, input_tokens_details.cached_tokens, output_tokens,
//  output_tokens_details.reasoning_tokens, total_tokens}
Json responses_usage_json(const Usage& usage, int reasoning_tokens);

// The parts of a response object that change as it runs.
struct ResponseState {
  std::string id;
  int64_t created_at = 0;
  std::string model;
  std::string status = "in_progress";  // in_progress, completed, incomplete, failed
  Json output = Json::array();
  Json usage = nullptr;
  Json error = nullptr;               // {code, message} when failed
  Json incomplete_details = nullptr;  // {reason: "max_output_tokens"} when incomplete
};

// The response object: `state` with the request's echoed fields (ResponsesRequest::echo).
Json response_json(const ResponseState& state, const Json& echo);

// Appends a streamed response's events to the bytes a connection sends next. The events of a
// message whose text streams as it is generated: message_started, text_delta..., then
// finish() with the final items (the first of which is that message).
class ResponseEventWriter {
 public:
  explicit ResponseEventWriter(std::string& out, int& sequence_number)
      : out_(out), sequence_number_(sequence_number) {}

  // response.created and response.in_progress.
  void started(const Json& response);
  // response.output_item.added + response.content_part.added for a message at output_index.
  void message_started(int output_index, const std::string& item_id);
  void text_delta(int output_index, const std::string& item_id, const std::string& delta);
  // Every item's remaining events (whole items for those not started), then
  // response.completed or response.incomplete. `started_items`: how many of the leading items
  // were begun with message_started.
  void finished(const Json& response, int started_items);
  // response.failed.
  void failed(const Json& response);

 private:
  void event(const char* type, Json fields);
  void item_added(int output_index, const Json& item);
  void item_body(int output_index, const Json& item, bool started);

  std::string& out_;
  int& sequence_number_;
};

}  // namespace attnres::server::http
