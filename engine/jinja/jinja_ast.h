// Syntax tree of a parsed Jinja template. Immutable after parsing, so one tree can be
// rendered from many threads at once.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/jinja/jinja_value.h"

namespace attnres::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    kLiteral,     // literal
    kName,        // name
    kList,        // children
    kTuple,       // children
    kDict,        // children: key, value, key, value, ...
    kGetAttr,     // children[0].name
    kGetItem,     // children[0][children[1]]
    kSlice,       // children[0][children[1]:children[2]:children[3]] (null = omitted)
    kCall,        // children[0](children[1..], kwargs)
    kFilter,      // children[0] | name(children[1..], kwargs)
    kTest,        // children[0] is [not] name(children[1..], kwargs)
    kUnary,       // name in {"-", "+", "not"}
    kBinary,      // children[0] name children[1]; name in {+ - * / // % ** ~ and or}
    kCompare,     // children[0] ops[0] children[1] ops[1] children[2] ...
    kCondExpr,    // children[1] if children[0] else children[2] (children[2] may be null)
    kBlockValue,  // the rendered body of {% filter %} / {% set x | f %} blocks
  };
  Kind kind;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  bool negated = false;
  std::vector<ExprPtr> children;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null when required
};

struct Stmt {
  enum class Kind {
    kText,      // text
    kPrint,     // {{ expr }}
    kIf,        // branches (cond, body); else_body
    kFor,       // targets in expr [if cond] body else_body
    kSet,       // target = expr
    kSetBlock,  // {% set target [| filters] %}body{% endset %}; expr = filter chain or null
    kMacro,     // name(params) body
    kBreak,
    kContinue,
    kFilterBlock,  // expr = filter chain applied to the rendered body
    kWith,         // assignments (targets[i] = values[i]) then body
    kPassthrough,  // {% generation %}: transformers' assistant-mask marker, renders the body
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr target;
  ExprPtr cond;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<MacroParam> params;
  std::vector<ExprPtr> targets;
  std::vector<ExprPtr> values;
};

struct Template {
  Body body;
};

}  // namespace attnres::jinja
