// A chat request's tools, tool_choice and parallel_tool_calls, checked, and the output
// constraint that enforces tool_choice "required" or a named function: an xgrammar structural
// tag that lets the model write nothing but calls in its template's own syntax (hermes,
// llama3_json or mistral), each naming a given function, with arguments valid against that
// function's `parameters` schema. OpenAI's semantics: "none" makes no calls (the template still
// sees the tools, as in vLLM), "auto" lets the model choose (its calls are parsed), "required"
// forces at least one call, a named function exactly one call to it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/sample/output_constraint.h"
#include "server/common/tool_call_parser.h"

namespace attnres::server {

struct ToolFunction {
  std::string name;
  nlohmann::ordered_json parameters;  // a JSON schema; {"type": "object"} when not given
};

enum class ToolChoiceMode { None, Auto, Required, Named };

struct ToolChoice {
  ToolChoiceMode mode = ToolChoiceMode::None;
  std::string name;  // Named: the function
};

// `tools` (null or a list of {"type": "function", "function": {"name", "description",
// "parameters"}}) -> its functions. Throws RequestError (400, param "tools") naming the entry
// at fault.
std::vector<ToolFunction> read_tools(const nlohmann::ordered_json& tools);

// `tool_choice` (null: "auto" with tools, "none" without; "none" | "auto" | "required" |
// {"type": "function", "function": {"name": ...}}) against the tools. Throws RequestError
// (400, param "tool_choice") for another value, "required" or a name with no tools, or a name
// that is not one of the tools.
ToolChoice read_tool_choice(const nlohmann::ordered_json& tool_choice,
                            const std::vector<ToolFunction>& tools);

// The structural tag (ConstraintKind::StructuralTag) that enforces a Required or Named choice
// in `format`'s call syntax; at most one call when !parallel (and always for Named).
// `format` must not be None (the caller refuses forced choices on a model without a parser).
OutputConstraint forced_tool_call_constraint(ToolCallFormat format,
                                             const std::vector<ToolFunction>& tools,
                                             const ToolChoice& choice, bool parallel);

}  // namespace attnres::server
