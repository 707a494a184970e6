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
// object). Template errors (raise_exception included) are attnres::Error -> 400.
std::string render_chat_prompt(const LoadedModel& model, const nlohmann::ordered_json& messages,
                               bool add_generation_prompt, const nlohmann::ordered_json& tools,
                               const nlohmann::ordered_json& extra);

}  // namespace attnres::server::http
