// POST /v1/responses request bodies -> the chat request they amount to. The Responses input
// (a string, or a list of message / function_call / function_call_output / reasoning items,
// after the stored conversation of previous_response_id) becomes chat messages, the function
// tools become chat tools, and parse_chat_request renders and checks them as
// /v1/chat/completions would: tool_choice, parallel_tool_calls and text.format become the
// chat request's tool_choice, parallel_tool_calls and response_format, so forced calls and
// structured output are enforced, and answers split into items, exactly as on the chat path
// (the server's --tool-call-parser / --reasoning-parser included). Fields the Responses API
// defines that change the output and that this server cannot honour are refused with a 400
// naming them.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/common/server_state.h"
#include "server/http/openai_requests.h"
#include "server/http/responses_output.h"

namespace attnres::server::http {

struct ResponsesRequest {
  // The rendered conversation, the generation options (with the output constraint of a forced
  // tool_choice or text.format) and answer_format, how the answer splits into items.
  ChatRequest chat;
  // Every turn's input items (previous_response_id's conversation first), for the store.
  nlohmann::ordered_json conversation = nlohmann::ordered_json::array();
  // The request fields the response object repeats (instructions, tools, tool_choice, text,
  // temperature, top_p, max_output_tokens, previous_response_id, metadata, user, store, ...).
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
  bool store = true;
  bool parallel_tool_calls = true;
  std::optional<int> max_tool_calls;
};

ResponsesRequest parse_responses_request(const nlohmann::ordered_json& body,
                                         const ServerState& state);

// The pieces, exposed for unit tests. Each throws a 400 naming the field at fault.

// `input` as a list of items: a string is one user message.
nlohmann::ordered_json responses_input_items(const nlohmann::ordered_json& input);
// Responses items -> chat messages (developer -> system; function_call items -> an assistant
// message's tool_calls; function_call_output items -> tool messages; reasoning items -> the
// next assistant message's reasoning_content). `field` names the list in errors.
nlohmann::ordered_json responses_items_to_messages(const nlohmann::ordered_json& items,
                                                   const std::string& field);
// Responses function tools {type, name, description, parameters, strict} -> chat tools
// {type: "function", function: {...}}. Any other tool type is refused.
nlohmann::ordered_json responses_tools_to_chat(const nlohmann::ordered_json& tools);

}  // namespace attnres::server::http
