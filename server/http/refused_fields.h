// The request fields that the OpenAI API, vLLM or llama.cpp's server implement and this server
// does not: each present one (not null, and not the value that asks for nothing, such as
// `use_beam_search: false`) is a 400 naming it, so that no client gets an answer that silently
// ignored what it asked for. The table, one row per field with its reason, is in
// refused_fields.cpp; the fields accepted and ignored because they cannot change the output
// are listed there too (README.md, "Request fields").
#pragma once

#include <nlohmann/json.hpp>

namespace attnres::server::http {

enum class Endpoint { Completions, Chat };

// Throws ApiError 400 (param: the field) for the first refused field present in `body`.
void refuse_unsupported_fields(const nlohmann::ordered_json& body, Endpoint endpoint);

}  // namespace attnres::server::http
