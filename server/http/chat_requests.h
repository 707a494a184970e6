// Chat messages -> prompt text with the model's chat template (transformers'
// apply_chat_template semantics: add_generation_prompt, tools, extra template variables).
#pragma once

#include <nlohmann/json.hpp>

#include "engine/model/loaded_model.h"

namespace attnres::server::http {

// Checks the shape of `messages` (a non-empty list of objects with a string role; content a
// string, null, or a list of {"type": "text", "text"} parts) and returns a copy whose list
// contents are joined into one string, as vLLM does for string-content templates.
// Throws a 400 naming the message at fault.
nlohmann::ordered_json normalize_messages(const nlohmann::ordered_json& messages);

// Renders the conversation. `tools`: null or a list; `extra`: chat_template_kwargs (an
// object). `request_template`: the request's own chat_template, used instead of the model's
// when set. Template errors (raise_exception included) are attnres::Error -> 400.
std::string render_chat_prompt(const LoadedModel& model, const nlohmann::ordered_json& messages,
                               bool add_generation_prompt, const nlohmann::ordered_json& tools,
                               const nlohmann::ordered_json& extra,
                               const ChatTemplate* request_template = nullptr);

// vLLM's continue_final_message (transformers' apply_chat_template rule): `rendered` cut right
// after the final message's text, so that the model continues that message instead of closing
// it. A 400 when the template did not write the text (it altered or dropped it).
std::string cut_after_final_message(const std::string& rendered,
                                    const nlohmann::ordered_json& messages);

}  // namespace attnres::server::http
