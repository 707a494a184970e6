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

// Makes "<prefix>_<hex>" ids ("msg", "fc", "call", "rs").
using ItemIdMaker = std::function<std::string(std::string_view prefix)>;

Json reasoning_item(const std::string& id, const std::string& text);
Json message_item(const std::string& id, const std::string& text, const char* status);
Json function_call_item(const std::string& id, const ToolCall& call, const char* status);

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

// Writes a streamed response's events to the bytes a connection sends next (set_output
// before each batch), numbering them with sequence_number.
class ResponseEventWriter {
 public:
  void set_output(std::string* out) { out_ = out; }

  // response.created and response.in_progress.
  void started(const Json& response);
  // response.output_item.added with the item as given (its in-progress form).
  void item_added(int output_index, const Json& item);
  void content_part_added(int output_index, const std::string& item_id);
  void text_delta(int output_index, const std::string& item_id, const std::string& delta);
  // response.output_text.done and response.content_part.done.
  void text_done(int output_index, const std::string& item_id, const Json& part);
  void reasoning_delta(int output_index, const std::string& item_id, const std::string& delta);
  void reasoning_done(int output_index, const std::string& item_id, const std::string& text);
  void arguments_delta(int output_index, const std::string& item_id, const std::string& delta);
  void arguments_done(int output_index, const Json& item);
  void item_done(int output_index, const Json& item);
  // response.completed, or response.incomplete for an incomplete response.
  void ended(const Json& response);
  void failed(const Json& response);

 private:
  void event(const char* type, Json fields);

  std::string* out_ = nullptr;
  int sequence_number_ = 0;
};

}  // namespace attnres::server::http
