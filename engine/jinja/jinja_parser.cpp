#include "engine/jinja/jinja_parser.h"

#include <cerrno>
#include <cstdlib>
#include <initializer_list>

#include "engine/core/error.h"
#include "engine/jinja/jinja_lexer.h"

namespace attnres::jinja {
namespace {

// Deeply nested expressions or blocks would otherwise overflow the stack.
constexpr int kMaxNesting = 200;

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : toks_(std::move(tokens)) {}

  std::shared_ptr<const Template> run() {
    auto tmpl = std::make_shared<Template>();
    std::string end;
    tmpl->body = parse_body({}, end);
    return tmpl;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(Parser& p) : p(p) {
      if (++p.depth_ > kMaxNesting)
        p.fail("template nesting is too deep (limit " + std::to_string(kMaxNesting) + ")");
    }
    ~DepthGuard() { --p.depth_; }
    Parser& p;
  };

  const Token& cur() const { return toks_[pos_]; }
  const Token& peek(size_t n = 1) const { return toks_[std::min(pos_ + n, toks_.size() - 1)]; }
  void advance() {
    if (pos_ + 1 < toks_.size()) ++pos_;
  }

  [[noreturn]] void fail(const std::string& what) const { fail_at(cur(), what); }
  [[noreturn]] static void fail_at(const Token& t, const std::string& what) {
    throw Error("chat template syntax error at " + describe_position(t.line, t.column) + ": " +
                what);
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kData:
        return "template text";
      case TokenType::kVarBegin:
        return "'{{'";
      case TokenType::kVarEnd:
        return "end of print statement '}}'";
      case TokenType::kBlockBegin:
        return "'{%'";
      case TokenType::kBlockEnd:
        return "end of statement block '%}'";
      case TokenType::kName:
        return "'" + t.value + "'";
      case TokenType::kString:
        return "string literal";
      case TokenType::kInteger:
      case TokenType::kFloat:
        return "number " + t.value;
      case TokenType::kOperator:
        return "'" + t.value + "'";
      case TokenType::kEnd:
        return "end of template";
    }
    return "token";
  }

  bool is_op(const char* op) const {
    return cur().type == TokenType::kOperator && cur().value == op;
  }
  bool is_name(const char* n) const { return cur().type == TokenType::kName && cur().value == n; }
  bool skip_op(const char* op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(const char* n) {
    if (!is_name(n)) return false;
    advance();
    return true;
  }
  void expect_op(const char* op) {
    if (!skip_op(op)) fail(std::string("expected '") + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName) fail("expected a name, got " + describe(cur()));
    std::string v = cur().value;
    advance();
    return v;
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) {
      fail("expected end of statement block '%}', got " + describe(cur()));
    }
    advance();
  }

  ExprPtr make(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }

  // ---- statements -------------------------------------------------------------------------

  // Parses until `{% <one of end_names>` (left unconsumed after the name) or end of input.
  Body parse_body(std::initializer_list<const char*> end_names, std::string& end_found) {
    DepthGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = cur();
      if (t.type == TokenType::kEnd) {
        if (end_names.size() == 0) return body;
        std::string expected;
        for (const char* n : end_names)
          expected += (expected.empty() ? "'" : " or '") + std::string(n) + "'";
        fail("unexpected end of template, expected " + expected);
      }
      if (t.type == TokenType::kData) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->text = t.value;
        body.push_back(std::move(s));
        advance();
      } else if (t.type == TokenType::kVarBegin) {
        advance();
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kPrint;
        s->line = t.line;
        s->column = t.column;
        s->expr = parse_tuple(true);
        if (cur().type != TokenType::kVarEnd) {
          fail("expected end of print statement '}}', got " + describe(cur()));
        }
        advance();
        body.push_back(std::move(s));
      } else if (t.type == TokenType::kBlockBegin) {
        advance();
        if (cur().type != TokenType::kName)
          fail("expected a statement name, got " + describe(cur()));
        for (const char* n : end_names) {
          if (cur().value == n) {
            end_found = n;
            advance();
            return body;
          }
        }
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  StmtPtr new_stmt(Stmt::Kind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  StmtPtr parse_statement() {
    const Token tok = cur();
    const std::string& name = tok.value;
    advance();
    if (name == "if") return parse_if(tok);
    if (name == "for") return parse_for(tok);
    if (name == "set") return parse_set(tok);
    if (name == "macro") return parse_macro(tok);
    if (name == "filter") return parse_filter_block(tok);
    if (name == "with") return parse_with(tok);
    if (name == "generation") {
      auto s = new_stmt(Stmt::Kind::kPassthrough, tok);
      expect_block_end();
      std::string end;
      s->body = parse_body({"endgeneration"}, end);
      expect_block_end();
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail_at(tok, "'" + name + "' outside of a loop");
      auto s = new_stmt(name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, tok);
      expect_block_end();
      return s;
    }
    fail_at(tok, "encountered unknown tag '" + name + "'");
  }

  StmtPtr parse_if(const Token& tok) {
    auto s = new_stmt(Stmt::Kind::kIf, tok);
    ExprPtr cond = parse_tuple(true);
    while (true) {
      expect_block_end();
      std::string end;
      Body body = parse_body({"elif", "else", "endif"}, end);
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (end == "elif") {
        cond = parse_tuple(true);
        continue;
      }
      if (end == "else") {
        expect_block_end();
        s->else_body = parse_body({"endif"}, end);
      }
      expect_block_end();
      return s;
    }
  }

  // Assignment targets: a name, `ns.attr`, or a tuple of names.
  ExprPtr parse_assign_target(bool allow_attr) {
    const Token at = cur();
    std::string first = expect_name();
    if (allow_attr && is_op(".")) {
      advance();
      auto e = make(Expr::Kind::kGetAttr, at);
      auto base = make(Expr::Kind::kName, at);
      base->name = first;
      e->children.push_back(std::move(base));
      e->name = expect_name();
      return e;
    }
    auto name = make(Expr::Kind::kName, at);
    name->name = first;
    if (!is_op(",")) return name;
    auto tuple = make(Expr::Kind::kTuple, at);
    tuple->children.push_back(std::move(name));
    while (skip_op(",")) {
      if (cur().type != TokenType::kName) break;
      auto n = make(Expr::Kind::kName, cur());
      n->name = expect_name();
      tuple->children.push_back(std::move(n));
    }
    return tuple;
  }

  StmtPtr parse_for(const Token& tok) {
    auto s = new_stmt(Stmt::Kind::kFor, tok);
    s->target = parse_assign_target(false);
    if (!skip_name("in")) fail("expected 'in', got " + describe(cur()));
    s->expr = parse_tuple(false);
    if (skip_name("if")) s->cond = parse_expression(true);
    if (skip_name("recursive")) fail("recursive for loops are not supported");
    expect_block_end();
    std::string end;
    ++loop_depth_;
    s->body = parse_body({"endfor", "else"}, end);
    --loop_depth_;
    if (end == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"}, end);
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(const Token& tok) {
    ExprPtr target = parse_assign_target(true);
    if (skip_op("=")) {
      auto s = new_stmt(Stmt::Kind::kSet, tok);
      s->target = std::move(target);
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    auto s = new_stmt(Stmt::Kind::kSetBlock, tok);
    s->target = std::move(target);
    if (is_op("|")) s->expr = parse_filter_chain(make(Expr::Kind::kBlockValue, cur()));
    expect_block_end();
    std::string end;
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endset"}, end);
    loop_depth_ = saved;
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro(const Token& tok) {
    auto s = new_stmt(Stmt::Kind::kMacro, tok);
    s->text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!s->params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (skip_op("=")) p.default_value = parse_expression(true);
      s->params.push_back(std::move(p));
    }
    expect_op(")");
    expect_block_end();
    std::string end;
    int saved = loop_depth_;
    loop_depth_ = 0;
    s->body = parse_body({"endmacro"}, end);
    loop_depth_ = saved;
    if (cur().type == TokenType::kName) advance();  // optional {% endmacro name %}
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(const Token& tok) {
    auto s = new_stmt(Stmt::Kind::kFilterBlock, tok);
    s->expr = parse_filter_chain(make(Expr::Kind::kBlockValue, tok), /*leading_pipe=*/false);
    expect_block_end();
    std::string end;
    s->body = parse_body({"endfilter"}, end);
    expect_block_end();
    return s;
  }

  StmtPtr parse_with(const Token& tok) {
    auto s = new_stmt(Stmt::Kind::kWith, tok);
    while (cur().type != TokenType::kBlockEnd) {
      if (!s->targets.empty()) expect_op(",");
      s->targets.push_back(parse_assign_target(false));
      expect_op("=");
      s->values.push_back(parse_expression(true));
    }
    expect_block_end();
    std::string end;
    s->body = parse_body({"endwith"}, end);
    expect_block_end();
    return s;
  }

  // ---- expressions ------------------------------------------------------------------------

  // Comma-separated expressions form a tuple (as in `{{ a, b }}` or `for x in a, b`).
  ExprPtr parse_tuple(bool with_condexpr) {
    const Token at = cur();
    ExprPtr first = parse_expression(with_condexpr);
    if (!is_op(",")) return first;
    auto tuple = make(Expr::Kind::kTuple, at);
    tuple->children.push_back(std::move(first));
    while (skip_op(",")) {
      if (cur().type == TokenType::kBlockEnd || cur().type == TokenType::kVarEnd || is_op(")") ||
          is_name("if") || is_name("in")) {
        break;
      }
      tuple->children.push_back(parse_expression(with_condexpr));
    }
    return tuple;
  }

  ExprPtr parse_expression(bool with_condexpr) {
    DepthGuard guard(*this);
    if (!with_condexpr) return parse_or();
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const Token at = cur();
      advance();
      auto cond = make(Expr::Kind::kCondExpr, at);
      cond->children.push_back(parse_or());
      cond->children.push_back(std::move(expr));
      cond->children.push_back(skip_name("else") ? parse_expression(true) : nullptr);
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr binary(const Token& at, const std::string& op, ExprPtr l, ExprPtr r) {
    auto e = make(Expr::Kind::kBinary, at);
    e->name = op;
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const Token at = cur();
      advance();
      left = binary(at, "or", std::move(left), parse_and());
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const Token at = cur();
      advance();
      left = binary(at, "and", std::move(left), parse_not());
    }
    return left;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this);
      auto e = make(Expr::Kind::kUnary, cur());
      advance();
      e->name = "not";
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Token at = cur();
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      if (cur().type == TokenType::kOperator &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
           cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        op = cur().value;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().type == TokenType::kName && peek().value == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::Kind::kCompare, at);
        cmp->children.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token at = cur();
      advance();
      left = binary(at, at.value, std::move(left), parse_concat());
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const Token at = cur();
      advance();
      left = binary(at, "~", std::move(left), parse_math2());
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token at = cur();
      advance();
      left = binary(at, at.value, std::move(left), parse_pow());
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const Token at = cur();
      advance();
      left = binary(at, "**", std::move(left), parse_unary(true));
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      auto e = make(Expr::Kind::kUnary, cur());
      e->name = cur().value;
      advance();
      e->children.push_back(parse_unary(false));
      node = std::move(e);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token t = cur();
    switch (t.type) {
      case TokenType::kName: {
        advance();
        auto e = make(Expr::Kind::kLiteral, t);
        if (t.value == "true" || t.value == "True")
          e->literal = Value::boolean(true);
        else if (t.value == "false" || t.value == "False")
          e->literal = Value::boolean(false);
        else if (t.value == "none" || t.value == "None")
          e->literal = Value::none();
        else {
          e->kind = Expr::Kind::kName;
          e->name = t.value;
        }
        return e;
      }
      case TokenType::kString: {
        std::string s;
        while (cur().type == TokenType::kString) {  // adjacent literals concatenate
          s += cur().value;
          advance();
        }
        auto e = make(Expr::Kind::kLiteral, t);
        e->literal = Value::string(std::move(s));
        return e;
      }
      case TokenType::kInteger: {
        advance();
        auto e = make(Expr::Kind::kLiteral, t);
        errno = 0;
        long long v = std::strtoll(t.value.c_str(), nullptr, 10);
        if (errno == ERANGE) fail_at(t, "integer literal too large");
        e->literal = Value::integer(v);
        return e;
      }
      case TokenType::kFloat: {
        advance();
        auto e = make(Expr::Kind::kLiteral, t);
        e->literal = Value::floating(std::strtod(t.value.c_str(), nullptr));
        return e;
      }
      case TokenType::kOperator:
        if (t.value == "(") {
          advance();
          if (skip_op(")")) return make(Expr::Kind::kTuple, t);
          ExprPtr inner = parse_tuple(true);
          bool was_tuple = inner->kind == Expr::Kind::kTuple;
          expect_op(")");
          (void)was_tuple;
          return inner;
        }
        if (t.value == "[") {
          advance();
          auto e = make(Expr::Kind::kList, t);
          while (!is_op("]")) {
            if (!e->children.empty()) expect_op(",");
            if (is_op("]")) break;
            e->children.push_back(parse_expression(true));
          }
          expect_op("]");
          return e;
        }
        if (t.value == "{") {
          advance();
          auto e = make(Expr::Kind::kDict, t);
          while (!is_op("}")) {
            if (!e->children.empty()) expect_op(",");
            if (is_op("}")) break;
            e->children.push_back(parse_expression(true));
            expect_op(":");
            e->children.push_back(parse_expression(true));
          }
          expect_op("}");
          return e;
        }
        break;
      default:
        break;
    }
    fail("unexpected " + describe(t) + ", expected an expression");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const Token at = cur();
        advance();
        if (cur().type == TokenType::kName) {
          auto e = make(Expr::Kind::kGetAttr, at);
          e->name = cur().value;
          advance();
          e->children.push_back(std::move(node));
          node = std::move(e);
        } else if (cur().type == TokenType::kInteger) {
          auto e = make(Expr::Kind::kGetItem, at);
          auto idx = make(Expr::Kind::kLiteral, cur());
          idx->literal = Value::integer(std::strtoll(cur().value.c_str(), nullptr, 10));
          advance();
          e->children.push_back(std::move(node));
          e->children.push_back(std::move(idx));
          node = std::move(e);
        } else {
          fail("expected an attribute name after '.', got " + describe(cur()));
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node), Expr::Kind::kCall);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Token at = cur();
    advance();
    ExprPtr parts[3];
    bool is_slice = false;
    int idx = 0;
    while (!is_op("]")) {
      if (is_op(":")) {
        advance();
        is_slice = true;
        if (++idx > 2) fail("too many ':' in slice");
        continue;
      }
      if (parts[idx]) fail("expected ':' or ']', got " + describe(cur()));
      parts[idx] = parse_expression(true);
    }
    expect_op("]");
    if (!is_slice) {
      if (!parts[0]) fail_at(at, "expected a subscript expression");
      auto e = make(Expr::Kind::kGetItem, at);
      e->children.push_back(std::move(node));
      e->children.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(Expr::Kind::kSlice, at);
    e->children.push_back(std::move(node));
    for (auto& p : parts) e->children.push_back(std::move(p));
    return e;
  }

  // Parses `(args, kw=value)` into `call` (whose children[0] is already set or not).
  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (cur().type == TokenType::kName && peek().type == TokenType::kOperator &&
          peek().value == "=") {
        std::string key = cur().value;
        advance();
        advance();
        call.kwargs.emplace_back(key, parse_expression(true));
      } else {
        if (!call.kwargs.empty()) fail("positional argument follows keyword argument");
        call.children.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee, Expr::Kind kind) {
    auto e = make(kind, cur());
    e->children.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  std::string parse_dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == TokenType::kName) {
      advance();
      name += "." + expect_name();
    }
    return name;
  }

  ExprPtr parse_filter_chain(ExprPtr node, bool leading_pipe = true) {
    bool first = true;
    while ((first && !leading_pipe) || is_op("|")) {
      if (!(first && !leading_pipe)) advance();
      first = false;
      auto e = make(Expr::Kind::kFilter, cur());
      e->name = parse_dotted_name();
      e->children.push_back(std::move(node));
      if (is_op("(")) parse_call_args(*e);
      node = std::move(e);
    }
    return node;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        node = parse_filter_chain(std::move(node));
      } else if (is_name("is")) {
        const Token at = cur();
        advance();
        auto e = make(Expr::Kind::kTest, at);
        e->negated = skip_name("not");
        e->name = parse_dotted_name();
        e->children.push_back(std::move(node));
        if (is_op("(")) {
          parse_call_args(*e);
        } else if ((cur().type == TokenType::kName || cur().type == TokenType::kString ||
                    cur().type == TokenType::kInteger || cur().type == TokenType::kFloat ||
                    is_op("(") || is_op("[") || is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) fail("you cannot chain multiple tests with is");
          e->children.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node), Expr::Kind::kCall);
      } else {
        return node;
      }
    }
  }

  std::vector<Token> toks_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

std::shared_ptr<const Template> parse_template(const std::string& source) {
  return Parser(tokenize(source)).run();
}

}  // namespace attnres::jinja
