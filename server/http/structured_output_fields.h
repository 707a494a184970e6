// The structured-output request fields, in every spelling clients send, mapped onto
// SamplingParams::constraint (engine/sample/output_constraint.h):
//   OpenAI     response_format: {"type": "text" | "json_object" | "json_schema"
//   (json_schema.schema)
//              | "structural_tag" (vLLM's extension)}
//   vLLM       structured_outputs: {json | regex | choice | grammar | json_object | structural_tag}
//              and its older guided_json / guided_regex / guided_choice / guided_grammar
//              (guided_decoding_backend: "xgrammar" or "auto")
//   llama.cpp  grammar (GBNF), json_schema
// At most one constraint per request. The spec itself (does the schema, regex or grammar
// compile?) is checked when the engine compiles it, before the request is accepted.
#pragma once

#include "engine/sample/sampling_params.h"
#include "server/http/field_reader.h"

namespace attnres::server::http {

// Throws a 400 naming the field for a malformed value, an unknown type or option, or two
// constraints in one request.
void read_structured_output_fields(const FieldReader& f, SamplingParams& params);

}  // namespace attnres::server::http
