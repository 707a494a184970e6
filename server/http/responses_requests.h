// POST /v1/responses request bodies -> the chat request they amount to. The Responses input
// (a string, or a list of message / function_call / function_call_output / reasoning items,
// after the stored conversation of previous_response_id) becomes chat messages, the function
// tools become chat tools, and parse_chat_request renders and checks them as
// /v1/chat/completions would. Fields the Responses API defines that change the output and
// that this server cannot honour are refused with a 400 naming them.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "server/common/server_state.h"
#include "server/http/openai_requests.h"
#include "server/http/responses_output.h"

namespace attnres::server::http {

struct ResponsesRequest {
  ChatRequest chat;  // the rendered conversation and the generation options
  // Every turn's input items (previous_response_id's conversation first), for the store.
  nlohmann::ordered_json conversation = nlohmann::ordered_json::array();
  // The request fields the response object repeats (instructions, tools, tool_choice, text,
  // temperature, top_p, max_output_tokens, previous_response_id, metadata, user, store, ...).
  nlohmann::ordered_json echo = nlohmann::ordered_json::object();
  bool store = true;
  // Tools the model may call (given, and tool_choice is not "none").
  bool tools_active = false;
  bool parallel_tool_calls = true;
  std::optional<int> max_tool_calls;
  // How the answer splits into reasoning, message and function calls (calls only when tools
  // are active).
  AnswerFormats formats;
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
