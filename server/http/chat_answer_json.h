// A parsed chat answer in the OpenAI / vLLM chat shapes: the message's content, tool_calls
// and reasoning fields (reasoning_content, and vLLM's newer name reasoning), the streamed
// deltas, and finish_reason "tool_calls".
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "engine/sched/request_stream.h"
#include "server/common/chat_answer.h"

namespace attnres::server::http {

using Json = nlohmann::ordered_json;

// Sets message.content (null when there is none), message.tool_calls (when calls were made)
// and, when the request parses reasoning, message.reasoning_content / message.reasoning (null
// without reasoning, or when include_reasoning is false).
void set_message_answer(Json& message, const ChatAnswer& answer, const ChatAnswerFormat& format,
                        bool include_reasoning);

// One step's answer pieces as chat deltas: reasoning and content in the first, then each
// tool-call piece; a call's first piece ({index, id, type, function: {name, arguments: ""}})
// and its argument fragments go in separate deltas, as vLLM streams them. Empty when the step
// released nothing.
std::vector<Json> chat_answer_deltas(const ChatAnswerDelta& delta, bool include_reasoning);

// "tool_calls" for an answer that stopped after making calls; the engine's reason otherwise
// (an answer cut by max_tokens stays "length").
Json chat_finish_reason_json(FinishReason reason, bool made_calls);

}  // namespace attnres::server::http
