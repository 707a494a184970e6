#include "engine/jinja/jinja_interpreter.h"

#include "engine/core/error.h"
#include "engine/jinja/jinja_builtins.h"

namespace attnres::jinja {
namespace {

// An Error that already names its template line, so outer statements do not re-wrap it.
class PositionedError : public Error {
 public:
  using Error::Error;
};

}  // namespace

Interpreter::Interpreter(const Template& tmpl, const RenderLimits& limits)
    : tmpl_(tmpl), limits_(limits) {}

std::string Interpreter::render(const DictItems& context) {
  frames_.clear();
  push_frame(-1);
  for (auto& [name, value] : make_globals(*this)) frames_[0].vars[name] = value;
  for (const auto& [k, v] : context) {
    if (k.is_string()) frames_[0].vars[k.str()] = v;
  }
  std::string out;
  out_ = &out;
  // Runs on every exit, an error included: nothing of the render outlives it.
  struct EndOfRender {
    Interpreter& in;
    ~EndOfRender() {
      in.out_ = nullptr;
      for (Value& ns : in.assigned_namespaces_) ns.namespace_items().clear();
      in.assigned_namespaces_.clear();
      in.assigned_namespace_ids_.clear();
      in.frames_.clear();
      in.block_values_.clear();
    }
  } end_of_render{*this};
  exec_body(tmpl_.body);
  return out;
}

void Interpreter::push_frame(int parent) {
  frames_.push_back(Frame{{}, parent});
  current_ = static_cast<int>(frames_.size()) - 1;
}

void Interpreter::pop_frame() {
  int parent = frames_.back().parent;
  frames_.pop_back();
  current_ = parent;
}

Value Interpreter::lookup(const std::string& name) const {
  for (int f = current_; f >= 0; f = frames_[f].parent) {
    auto it = frames_[f].vars.find(name);
    if (it != frames_[f].vars.end()) return it->second;
  }
  return Value::undefined("'" + name + "' is undefined");
}

void Interpreter::set_var(const std::string& name, const Value& value) {
  frames_[current_].vars[name] = value;
}

void Interpreter::check_size(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    throw Error("output exceeds the limit of " + std::to_string(limits_.max_output_bytes) +
                " bytes");
  }
}

void Interpreter::count_iterations(int64_t n) {
  iterations_ += n;
  if (iterations_ > limits_.max_loop_iterations) {
    throw Error("loop iterations exceed the limit of " +
                std::to_string(limits_.max_loop_iterations));
  }
}

void Interpreter::write(const std::string& text) {
  check_size(out_->size() + text.size());
  out_->append(text);
}

// ---- statements ---------------------------------------------------------------------------

Interpreter::Flow Interpreter::exec_body(const Body& body) {
  for (const auto& s : body) {
    Flow f = exec(*s);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

std::string Interpreter::render_body_to_string(const Body& body) {
  std::string buffer;
  std::string* saved = out_;
  out_ = &buffer;
  try {
    exec_body(body);
  } catch (...) {
    out_ = saved;
    throw;
  }
  out_ = saved;
  return buffer;
}

Interpreter::Flow Interpreter::exec(const Stmt& s) {
  try {
    switch (s.kind) {
      case Stmt::Kind::kText:
        write(s.text);
        break;
      case Stmt::Kind::kPrint:
        write(eval(*s.expr).to_string());
        break;
      case Stmt::Kind::kIf: {
        Flow flow = Flow::kNormal;
        exec_if(s, flow);
        return flow;
      }
      case Stmt::Kind::kFor:
        exec_for(s);
        break;
      case Stmt::Kind::kSet:
        assign(*s.target, eval(*s.expr));
        break;
      case Stmt::Kind::kSetBlock: {
        Value v = Value::string(render_body_to_string(s.body));
        if (s.expr) {
          block_values_.push_back(v);
          v = eval(*s.expr);
          block_values_.pop_back();
        }
        assign(*s.target, v);
        break;
      }
      case Stmt::Kind::kMacro:
        set_var(s.text, make_macro(s));
        break;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kFilterBlock: {
        block_values_.push_back(Value::string(render_body_to_string(s.body)));
        Value v = eval(*s.expr);
        block_values_.pop_back();
        write(v.to_string());
        break;
      }
      case Stmt::Kind::kWith: {
        std::vector<Value> values;
        for (const auto& v : s.values) values.push_back(eval(*v));
        push_frame(current_);
        for (size_t i = 0; i < values.size(); ++i) assign(*s.targets[i], values[i]);
        Flow f = exec_body(s.body);
        pop_frame();
        return f;
      }
      case Stmt::Kind::kPassthrough:
        return exec_body(s.body);
    }
  } catch (const PositionedError&) {
    throw;
  } catch (const Error& e) {
    throw PositionedError("chat template error at line " + std::to_string(s.line) + ": " +
                          e.what());
  }
  return Flow::kNormal;
}

void Interpreter::exec_if(const Stmt& s, Flow& flow) {
  for (const auto& [cond, body] : s.branches) {
    if (eval(*cond).truthy()) {
      flow = exec_body(body);
      return;
    }
  }
  flow = exec_body(s.else_body);
}

void Interpreter::exec_for(const Stmt& s) {
  Value iterable = eval(*s.expr);
  ValueList items = iterate(iterable);
  if (s.cond) {
    ValueList kept;
    for (const Value& item : items) {
      push_frame(current_);
      assign(*s.target, item);
      bool keep = eval(*s.cond).truthy();
      pop_frame();
      if (keep) kept.push_back(item);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    push_frame(current_);
    exec_body(s.else_body);
    pop_frame();
    return;
  }
  const int64_t n = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < n; ++i) {
    count_iterations(1);
    push_frame(current_);
    assign(*s.target, items[i]);
    DictItems loop = {
        {Value::string("index0"), Value::integer(i)},
        {Value::string("index"), Value::integer(i + 1)},
        {Value::string("revindex0"), Value::integer(n - i - 1)},
        {Value::string("revindex"), Value::integer(n - i)},
        {Value::string("first"), Value::boolean(i == 0)},
        {Value::string("last"), Value::boolean(i == n - 1)},
        {Value::string("length"), Value::integer(n)},
        {Value::string("depth"), Value::integer(1)},
        {Value::string("depth0"), Value::integer(0)},
    };
    if (i > 0) loop.emplace_back(Value::string("previtem"), items[i - 1]);
    if (i + 1 < n) loop.emplace_back(Value::string("nextitem"), items[i + 1]);
    loop.emplace_back(Value::string("cycle"), Value::callable("cycle", [i](CallArgs& a) {
                        if (a.args.empty()) throw Error("no items for cycling given");
                        return a.args[static_cast<size_t>(i) % a.args.size()];
                      }));
    set_var("loop", Value::dict(std::move(loop)));
    Flow f = Flow::kNormal;
    try {
      f = exec_body(s.body);
    } catch (...) {
      pop_frame();
      throw;
    }
    pop_frame();
    if (f == Flow::kBreak) break;
  }
}

void Interpreter::assign(const Expr& target, const Value& value) {
  if (target.kind == Expr::Kind::kName) {
    set_var(target.name, value);
  } else if (target.kind == Expr::Kind::kGetAttr) {
    Value ns = lookup(target.children[0]->name);
    if (!ns.is_namespace()) throw Error("cannot assign attribute on non-namespace object");
    DictItems& items = ns.namespace_items();
    if (assigned_namespace_ids_.insert(&items).second) assigned_namespaces_.push_back(ns);
    for (auto& [k, v] : items) {
      if (k.is_string() && k.str() == target.name) {
        v = value;
        return;
      }
    }
    items.emplace_back(Value::string(target.name), value);
  } else if (target.kind == Expr::Kind::kTuple) {
    ValueList parts = iterate(value);
    if (parts.size() != target.children.size()) {
      throw Error(parts.size() > target.children.size()
                      ? "too many values to unpack (expected " +
                            std::to_string(target.children.size()) + ")"
                      : "not enough values to unpack (expected " +
                            std::to_string(target.children.size()) + ", got " +
                            std::to_string(parts.size()) + ")");
    }
    for (size_t i = 0; i < parts.size(); ++i) assign(*target.children[i], parts[i]);
  } else {
    throw Error("cannot assign to this expression");
  }
}

Value Interpreter::make_macro(const Stmt& s) {
  const Stmt* stmt = &s;
  return Value::callable(s.text, [this, stmt](CallArgs& args) {
    if (args.args.size() > stmt->params.size()) {
      throw Error("macro '" + stmt->text + "' takes not more than " +
                  std::to_string(stmt->params.size()) + " argument(s)");
    }
    if (++call_depth_ > limits_.max_call_depth) {
      --call_depth_;
      throw Error("macro calls nested deeper than " + std::to_string(limits_.max_call_depth));
    }
    int saved = current_;
    push_frame(0);  // macros see the template's top-level variables, not the caller's
    try {
      for (const auto& [k, v] : args.kwargs) {
        bool known = false;
        for (const auto& p : stmt->params) known = known || p.name == k;
        if (!known) throw Error("macro '" + stmt->text + "' takes no keyword argument '" + k + "'");
      }
      for (size_t i = 0; i < stmt->params.size(); ++i) {
        const MacroParam& p = stmt->params[i];
        const Value* given = args.get(i, p.name);
        if (given)
          set_var(p.name, *given);
        else if (p.default_value)
          set_var(p.name, eval(*p.default_value));
        else
          set_var(p.name, Value::undefined("parameter '" + p.name + "' was not provided"));
      }
      std::string result = render_body_to_string(stmt->body);
      pop_frame();
      current_ = saved;
      --call_depth_;
      return Value::string(std::move(result));
    } catch (...) {
      pop_frame();
      current_ = saved;
      --call_depth_;
      throw;
    }
  });
}

// ---- expressions --------------------------------------------------------------------------

Value Interpreter::eval(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName:
      return lookup(e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      ValueList items;
      for (const auto& c : e.children) items.push_back(eval(*c));
      return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      DictItems items;
      for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
        Value k = eval(*e.children[i]);
        Value v = eval(*e.children[i + 1]);
        bool replaced = false;
        for (auto& kv : items) {
          if (kv.first.equals(k)) {
            kv.second = v;
            replaced = true;
          }
        }
        if (!replaced) items.emplace_back(std::move(k), std::move(v));
      }
      return Value::dict(std::move(items));
    }
    case Expr::Kind::kGetAttr:
      return getattr(eval(*e.children[0]), e.name);
    case Expr::Kind::kGetItem:
      return getitem(eval(*e.children[0]), eval(*e.children[1]));
    case Expr::Kind::kSlice:
      return eval_slice(e);
    case Expr::Kind::kCall:
      return eval_call(e);
    case Expr::Kind::kFilter:
      return eval_filter(e);
    case Expr::Kind::kTest: {
      Value subject = eval(*e.children[0]);
      CallArgs args;
      eval_args(e, 1, args);
      return Value::boolean(test(e.name, subject, args) != e.negated);
    }
    case Expr::Kind::kUnary: {
      Value v = eval(*e.children[0]);
      if (e.name == "not") return Value::boolean(!v.truthy());
      if (v.is_undefined()) undefined_error(v);
      if (v.is_float()) return Value::floating(e.name == "-" ? -v.as_double() : v.as_double());
      if (v.is_number()) return Value::integer(e.name == "-" ? -v.as_int() : v.as_int());
      throw Error("bad operand type for unary " + e.name + ": '" + v.type_name() + "'");
    }
    case Expr::Kind::kBinary:
      return eval_binary(e);
    case Expr::Kind::kCompare:
      return eval_compare(e);
    case Expr::Kind::kCondExpr: {
      if (eval(*e.children[0]).truthy()) return eval(*e.children[1]);
      if (e.children[2]) return eval(*e.children[2]);
      return Value::undefined(
          "the inline if-expression evaluated to false and no else section "
          "was defined");
    }
    case Expr::Kind::kBlockValue:
      return block_values_.back();
  }
  return Value();
}

Value Interpreter::eval_binary(const Expr& e) {
  if (e.name == "and") {
    Value l = eval(*e.children[0]);
    return l.truthy() ? eval(*e.children[1]) : l;
  }
  if (e.name == "or") {
    Value l = eval(*e.children[0]);
    return l.truthy() ? l : eval(*e.children[1]);
  }
  Value l = eval(*e.children[0]);
  Value r = eval(*e.children[1]);
  return binary_op(*this, e.name, l, r);
}

Value Interpreter::eval_compare(const Expr& e) {
  Value left = eval(*e.children[0]);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = eval(*e.children[i + 1]);
    if (!compare_op(e.ops[i], left, right)) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

void Interpreter::eval_args(const Expr& e, size_t first_arg, CallArgs& out) {
  for (size_t i = first_arg; i < e.children.size(); ++i) out.args.push_back(eval(*e.children[i]));
  for (const auto& [k, v] : e.kwargs) out.kwargs.emplace_back(k, eval(*v));
}

Value Interpreter::eval_call(const Expr& e) {
  Value fn = eval(*e.children[0]);
  CallArgs args;
  eval_args(e, 1, args);
  return call(fn, args);
}

Value Interpreter::eval_filter(const Expr& e) {
  Value subject = eval(*e.children[0]);
  CallArgs args;
  eval_args(e, 1, args);
  return filter(e.name, subject, args);
}

Value Interpreter::call(const Value& fn, CallArgs& args) {
  if (fn.is_undefined()) undefined_error(fn);
  if (!fn.is_callable()) throw Error("'" + fn.type_name() + "' object is not callable");
  return fn.fn().fn(args);
}

Value Interpreter::eval_slice(const Expr& e) {
  Value obj = eval(*e.children[0]);
  Value parts[3];
  for (int i = 0; i < 3; ++i) {
    parts[i] = e.children[i + 1] ? eval(*e.children[i + 1]) : Value::none();
  }
  return slice_value(obj, parts[0], parts[1], parts[2]);
}

Value Interpreter::filter(const std::string& name, const Value& subject, CallArgs& args) {
  return apply_filter(*this, name, subject, args);
}

bool Interpreter::test(const std::string& name, const Value& subject, CallArgs& args) {
  return apply_test(*this, name, subject, args);
}

Value Interpreter::getattr(const Value& obj, const std::string& name) {
  return get_attribute(*this, obj, name);
}

Value Interpreter::getitem(const Value& obj, const Value& key) { return get_item(*this, obj, key); }

}  // namespace attnres::jinja
