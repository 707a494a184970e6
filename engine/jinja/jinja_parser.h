// Recursive-descent parser for Jinja, following jinja2's grammar and operator precedence
// (filters and `is` tests bind to unary expressions; `~` sits between + and *).
#pragma once

#include <memory>
#include <string>

#include "engine/jinja/jinja_ast.h"

namespace attnres::jinja {

// Throws attnres::Error with line/column and what was expected on a syntax error.
std::shared_ptr<const Template> parse_template(const std::string& source);

}  // namespace attnres::jinja
