// A request's structured-output constraint: what the generated text must match (a JSON schema,
// any JSON object, a regex, one of a list of strings, an EBNF grammar, or an xgrammar structural
// tag). The server maps the OpenAI / vLLM / llama.cpp request spellings onto it; the engine
// compiles it with xgrammar and masks each step's logits to the tokens the grammar allows.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace attnres {

enum class ConstraintKind { JsonSchema, JsonObject, Regex, Choice, Grammar, StructuralTag };

struct OutputConstraint {
  ConstraintKind kind = ConstraintKind::JsonObject;
  std::string spec;  // JSON schema text | regex | EBNF (xgrammar / GBNF) | structural tag JSON
                     // (xgrammar's format, as vLLM takes it) | Choice: a JSON array of strings
  // Reasoning: enforced only once this token id has been generated (vLLM applies structured
  // output after the reasoning ends); unset = from the first generated token.
  std::optional<int32_t> enforce_after_token;
  // The request field it came from ("response_format", "structured_outputs.json", ...): errors
  // about the spec (an invalid schema, regex or grammar) start with it, so the server's 400
  // names it. Not part of what the constraint means.
  std::string field = "constraint";

  bool operator==(const OutputConstraint&) const = default;
};

}  // namespace attnres
