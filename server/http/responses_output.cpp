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
  *out_ += "event: ";
  *out_ += type;
  *out_ += "\ndata: ";
  *out_ += dump_json(data);
  *out_ += "\n\n";
}

void ResponseEventWriter::started(const Json& response) {
  event("response.created", {{"response", response}});
  event("response.in_progress", {{"response", response}});
}

void ResponseEventWriter::item_added(int output_index, const Json& item) {
  event("response.output_item.added", {{"output_index", output_index}, {"item", item}});
}

void ResponseEventWriter::content_part_added(int output_index, const std::string& item_id) {
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

void ResponseEventWriter::text_done(int output_index, const std::string& item_id,
                                    const Json& part) {
  event("response.output_text.done", {{"item_id", item_id},
                                      {"output_index", output_index},
                                      {"content_index", 0},
                                      {"text", part["text"]},
                                      {"logprobs", Json::array()}});
  event(
      "response.content_part.done",
      {{"item_id", item_id}, {"output_index", output_index}, {"content_index", 0}, {"part", part}});
}

void ResponseEventWriter::reasoning_delta(int output_index, const std::string& item_id,
                                          const std::string& delta) {
  event("response.reasoning_text.delta", {{"item_id", item_id},
                                          {"output_index", output_index},
                                          {"content_index", 0},
                                          {"delta", delta}});
}

void ResponseEventWriter::reasoning_done(int output_index, const std::string& item_id,
                                         const std::string& text) {
  event(
      "response.reasoning_text.done",
      {{"item_id", item_id}, {"output_index", output_index}, {"content_index", 0}, {"text", text}});
}

void ResponseEventWriter::arguments_delta(int output_index, const std::string& item_id,
                                          const std::string& delta) {
  event("response.function_call_arguments.delta",
        {{"item_id", item_id}, {"output_index", output_index}, {"delta", delta}});
}

void ResponseEventWriter::arguments_done(int output_index, const Json& item) {
  event("response.function_call_arguments.done", {{"item_id", item["id"]},
                                                  {"output_index", output_index},
                                                  {"name", item["name"]},
                                                  {"arguments", item["arguments"]}});
}

void ResponseEventWriter::item_done(int output_index, const Json& item) {
  event("response.output_item.done", {{"output_index", output_index}, {"item", item}});
}

void ResponseEventWriter::ended(const Json& response) {
  event(response["status"] == "incomplete" ? "response.incomplete" : "response.completed",
        {{"response", response}});
}

void ResponseEventWriter::failed(const Json& response) {
  event("response.failed", {{"response", response}});
}

}  // namespace attnres::server::http
