// Jinja lexer with the whitespace rules transformers uses (trim_blocks, lstrip_blocks,
// keep_trailing_newline=False), reproducing jinja2's lexer decisions byte for byte.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attnres::jinja {

enum class TokenType {
  kData,        // literal template text (already whitespace-adjusted)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,  // value is the unescaped string
  kInteger,
  kFloat,
  kOperator,  // + - * / // % ** ~ ( ) [ ] { } == != < <= > >= = . : | , ;
  kEnd,
};

struct Token {
  TokenType type;
  std::string value;
  int line = 1;
  int column = 1;
};

// Throws attnres::Error ("chat template syntax error at line L, column C: ...") on bad input.
std::vector<Token> tokenize(const std::string& source);

// "line L, column C" for error messages.
std::string describe_position(int line, int column);

}  // namespace attnres::jinja
