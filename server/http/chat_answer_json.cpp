#include "server/http/chat_answer_json.h"

#include "server/http/openai_responses.h"

namespace attnres::server::http {
namespace {

Json tool_call_json(const ToolCall& call) {
  Json j;
  j["id"] = call.id;
  j["type"] = "function";
  j["function"] = {{"name", call.name}, {"arguments", call.arguments}};
  return j;
}

Json tool_call_delta_json(const ToolCallDelta& d) {
  Json j;
  j["index"] = d.index;
  if (d.id) {
    j["id"] = *d.id;
    j["type"] = "function";
    j["function"] = {{"name", d.name.value_or("")}, {"arguments", d.arguments}};
  } else {
    j["function"] = {{"arguments", d.arguments}};
  }
  return j;
}

}  // namespace

void set_message_answer(Json& message, const ChatAnswer& answer, const ChatAnswerFormat& format,
                        bool include_reasoning) {
  message["content"] = answer.content ? Json(*answer.content) : Json(nullptr);
  if (!answer.calls.empty()) {
    Json calls = Json::array();
    for (const ToolCall& call : answer.calls) calls.push_back(tool_call_json(call));
    message["tool_calls"] = std::move(calls);
  }
  if (format.reasoning != ReasoningFormat::None) {
    const Json reasoning =
        include_reasoning && answer.reasoning ? Json(*answer.reasoning) : Json(nullptr);
    message["reasoning_content"] = reasoning;
    message["reasoning"] = reasoning;
  }
}

std::vector<Json> chat_answer_deltas(const ChatAnswerDelta& delta, bool include_reasoning) {
  std::vector<Json> deltas;
  Json first = Json::object();
  if (include_reasoning && !delta.reasoning.empty()) {
    first["reasoning_content"] = delta.reasoning;
    first["reasoning"] = delta.reasoning;
  }
  if (!delta.content.empty()) first["content"] = delta.content;
  if (!first.empty()) deltas.push_back(std::move(first));
  for (const ToolCallDelta& d : delta.calls) {
    Json j;
    j["tool_calls"] = Json::array({tool_call_delta_json(d)});
    deltas.push_back(std::move(j));
  }
  return deltas;
}

Json chat_finish_reason_json(FinishReason reason, bool made_calls) {
  if (made_calls && reason == FinishReason::Stop) return "tool_calls";
  return finish_reason_json(reason);
}

}  // namespace attnres::server::http
