// JSON-schema keywords xgrammar's schema converter skips with only a log line (it would
// generate output that may violate them). A request whose schema uses one is refused instead,
// as vLLM refuses them for its xgrammar backend: never accepted and silently not enforced.
#pragma once

#include <optional>
#include <string>

namespace attnres {

// The first unsupported keyword in the schema text with its location ("'not' at
// /properties/a"); nullopt when there is none or the text is not JSON (the compiler reports
// that).
std::optional<std::string> unsupported_json_schema_keyword(const std::string& schema);

// How deep the JSON text's objects and arrays nest (brackets outside strings). xgrammar's
// compile time grows steeply with a schema's depth (docs/BENCHMARKS.md, "Structured output").
int json_nesting_depth(const std::string& text);

}  // namespace attnres
