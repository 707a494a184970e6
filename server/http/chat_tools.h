// The chat request fields about tools and reasoning: tools, tool_choice, parallel_tool_calls
// (OpenAI) and include_reasoning (vLLM), and what they make of a request: how its answer is
// split into reasoning, content and tool calls, and the output constraint that enforces
// tool_choice "required" or a named function.
#pragma once

#include <vector>

#include "server/common/server_state.h"
#include "server/common/tool_choice.h"
#include "server/http/field_reader.h"
#include "server/http/openai_requests.h"

namespace attnres::server::http {

struct ChatToolFields {
  std::vector<ToolFunction> functions;
  ToolChoice choice;
  bool parallel = true;  // parallel_tool_calls
  bool include_reasoning = true;
};

// Reads and checks the fields (400s name the field at fault).
ChatToolFields read_chat_tool_fields(const FieldReader& f);

// Once the prompt is rendered: sets request.answer_format (the server's parsers, calls parsed
// unless tool_choice is "none", where the prompt leaves thinking), request.include_reasoning,
// and for a forced tool_choice the sampling constraint, enforced after the reasoning ends.
void apply_chat_tool_fields(const ChatToolFields& fields, const ServerState& state,
                            ChatRequest& request);

}  // namespace attnres::server::http
