#include "server/http/responses_output.h"

#include "server/http/api_error.h"

namespace attnres::server::http {
namespace {

Json output_text_part(const std::string& text) {
  return {{"type", "output_text"},
          {"text", text},
          {"annotations", Json::array()},
          {"logprobs", Json::array()}};
}

}  // namespace

Json reasoning_item(const std::string& id, const std::string& text) {
  return {{"id", id},
          {"type", "reasoning"},
          {"summary", Json::array()},
          {"content", Json::array({{{"type", "reasoning_text"}, {"text", text}}})},
          {"encrypted_content", nullptr},
          {"status", "completed"}};
}

Json message_item(const std::string& id, const std::string& text, const char* status) {
  return {{"id", id},
          {"type", "message"},
          {"status", status},
          {"role", "assistant"},
          {"content", Json::array({output_text_part(text)})}};
}

Json function_call_item(const std::string& id, const ToolCall& call, const char* status) {
  return {{"id", id},           {"type", "function_call"}, {"status", status},
          {"call_id", call.id}, {"name", call.name},       {"arguments", call.arguments}};
}

AssistantTurn split_answer(const AnswerFormats& formats, std::string_view text) {
  AssistantTurn turn;
  std::string rest(text);
  if (formats.reasoning != ReasoningFormat::None) {
    ParsedReasoning parsed = parse_reasoning(formats.reasoning, formats.prompt_thinking, text);
    turn.reasoning = parsed.reasoning.value_or("");
    rest = parsed.content.value_or("");
  }
  if (formats.tool_calls != ToolCallFormat::None) {
    ParsedToolCalls parsed = parse_tool_calls(formats.tool_calls, rest);
    turn.calls = std::move(parsed.calls);
    rest = parsed.content.value_or("");
  }
  turn.content = std::move(rest);
  return turn;
}

Json output_items(const AssistantTurn& turn, bool incomplete, const ItemIdMaker& ids) {
  const char* status = incomplete ? "incomplete" : "completed";
  Json items = Json::array();
  if (!turn.reasoning.empty()) items.push_back(reasoning_item(ids("rs"), turn.reasoning));
  if (!turn.content.empty() || turn.calls.empty()) {
    items.push_back(message_item(ids("msg"), turn.content, status));
  }
  for (const ToolCall& call : turn.calls) {
    items.push_back(function_call_item(ids("fc"), call, status));
  }
  return items;
}

Json responses_usage_json(const Usage& usage, int reasoning_tokens) {
  Json j;
  j["input_tokens"] = usage.prompt_tokens;
  j["input_tokens_details"] = {{"cached_tokens", usage.cached_tokens}};
  j["output_tokens"] = usage.completion_tokens;
  j["output_tokens_details"] = {{"reasoning_tokens", reasoning_tokens}};
  j["total_tokens"] = usage.total_tokens();
  return j;
}

Json response_json(const ResponseState& state, const Json& echo) {
  Json r;
  r["id"] = state.id;
  r["object"] = "response";
  r["created_at"] = state.created_at;
  r["status"] = state.status;
  r["background"] = false;
  r["error"] = state.error;
  r["incomplete_details"] = state.incomplete_details;
  r["model"] = state.model;
  r["output"] = state.output;
  r["usage"] = state.usage;
  for (const auto& [key, value] : echo.items()) r[key] = value;
  return r;
}

void ResponseEventWriter::event(const char* type, Json fields) {
  Json data;
  data["type"] = type;
  data["sequence_number"] = sequence_number_++;
  for (auto& [key, value] : fields.items()) data[key] = std::move(value);
  out_ += "event: ";
  out_ += type;
  out_ += "\ndata: ";
  out_ += dump_json(data);
  out_ += "\n\n";
}

void ResponseEventWriter::started(const Json& response) {
  event("response.created", {{"response", response}});
  event("response.in_progress", {{"response", response}});
}

void ResponseEventWriter::item_added(int output_index, const Json& item) {
  Json pending = item;
  pending["status"] = "in_progress";
  if (item["type"] == "message") pending["content"] = Json::array();
  if (item["type"] == "function_call") pending["arguments"] = "";
  if (item["type"] == "reasoning") pending["content"] = Json::array();
  event("response.output_item.added", {{"output_index", output_index}, {"item", pending}});
}

void ResponseEventWriter::message_started(int output_index, const std::string& item_id) {
  item_added(output_index, message_item(item_id, "", "in_progress"));
  event("response.content_part.added", {{"item_id", item_id},
                                        {"output_index", output_index},
                                        {"content_index", 0},
                                        {"part", output_text_part("")}});
}

void ResponseEventWriter::text_delta(int output_index, const std::string& item_id,
                                     const std::string& delta) {
  event("response.output_text.delta", {{"item_id", item_id},
                                       {"output_index", output_index},
                                       {"content_index", 0},
                                       {"delta", delta},
                                       {"logprobs", Json::array()}});
}

void ResponseEventWriter::item_body(int output_index, const Json& item, bool started) {
  const std::string id = item["id"];
  const std::string type = item["type"];
  if (type == "message") {
    if (!started) message_started(output_index, id);
    const Json& part = item["content"][0];
    const std::string text = part["text"];
    if (!started && !text.empty()) text_delta(output_index, id, text);
    event("response.output_text.done", {{"item_id", id},
                                        {"output_index", output_index},
                                        {"content_index", 0},
                                        {"text", text},
                                        {"logprobs", Json::array()}});
    event("response.content_part.done",
          {{"item_id", id}, {"output_index", output_index}, {"content_index", 0}, {"part", part}});
  } else if (type == "function_call") {
    item_added(output_index, item);
    event("response.function_call_arguments.delta",
          {{"item_id", id}, {"output_index", output_index}, {"delta", item["arguments"]}});
    event("response.function_call_arguments.done", {{"item_id", id},
                                                    {"output_index", output_index},
                                                    {"name", item["name"]},
                                                    {"arguments", item["arguments"]}});
  } else if (type == "reasoning") {
    item_added(output_index, item);
    const std::string text = item["content"][0]["text"];
    event("response.reasoning_text.delta",
          {{"item_id", id}, {"output_index", output_index}, {"content_index", 0}, {"delta", text}});
    event("response.reasoning_text.done",
          {{"item_id", id}, {"output_index", output_index}, {"content_index", 0}, {"text", text}});
  }
  event("response.output_item.done", {{"output_index", output_index}, {"item", item}});
}

void ResponseEventWriter::finished(const Json& response, int started_items) {
  const Json& items = response["output"];
  for (size_t i = 0; i < items.size(); ++i) {
    item_body(static_cast<int>(i), items[i], static_cast<int>(i) < started_items);
  }
  event(response["status"] == "incomplete" ? "response.incomplete" : "response.completed",
        {{"response", response}});
}

void ResponseEventWriter::failed(const Json& response) {
  event("response.failed", {{"response", response}});
}

}  // namespace attnres::server::http
