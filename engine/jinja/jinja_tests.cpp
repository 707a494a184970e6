// jinja2's built-in tests (`x is defined`, `x is string`, ...) and the globals transformers
// exposes to chat templates (raise_exception, strftime_now) next to jinja2's own.
#include <ctime>

#include "engine/core/error.h"
#include "engine/jinja/jinja_builtins.h"
#include "engine/jinja/jinja_utf8.h"

namespace attnres::jinja {
namespace {

const Value& arg0(const std::string& test, CallArgs& a) {
  if (a.args.empty()) throw Error("test '" + test + "' needs an argument");
  return a.args[0];
}

bool all_chars(const std::string& s, bool upper) {
  bool any = false;
  for (char32_t c : utf8::decode(s)) {
    if (utf8::is_upper(c) || utf8::is_lower(c)) {
      any = true;
      if (utf8::is_upper(c) != upper) return false;
    }
  }
  return any;
}

// jinja2's sandbox caps range() at MAX_RANGE items.
constexpr int64_t kMaxRange = 100000;

Value range_fn(CallArgs& a) {
  if (!a.kwargs.empty()) throw Error("range() takes no keyword arguments");
  for (const Value& v : a.args) {
    if (!v.is_int() && !v.is_bool())
      throw Error("'" + v.type_name() + "' object cannot be interpreted as an integer");
  }
  int64_t start = 0, stop = 0, step = 1;
  if (a.args.size() == 1)
    stop = a.args[0].as_int();
  else if (a.args.size() == 2 || a.args.size() == 3) {
    start = a.args[0].as_int();
    stop = a.args[1].as_int();
    if (a.args.size() == 3) step = a.args[2].as_int();
  } else {
    throw Error("range expected 1 to 3 arguments, got " + std::to_string(a.args.size()));
  }
  if (step == 0) throw Error("range() arg 3 must not be zero");
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<int64_t>(out.size()) >= kMaxRange) {
      throw Error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    out.push_back(Value::integer(i));
  }
  return Value::list(std::move(out));
}

DictItems kwargs_to_items(const CallArgs& a, size_t max_positional, const std::string& fn) {
  if (a.args.size() > max_positional)
    throw Error(fn + "() takes at most " + std::to_string(max_positional) + " positional argument");
  DictItems items;
  if (!a.args.empty()) {
    if (!a.args[0].is_dict()) throw Error(fn + "() argument must be a mapping");
    items = a.args[0].dict_items();
  }
  for (const auto& [k, v] : a.kwargs) {
    bool replaced = false;
    for (auto& kv : items) {
      if (kv.first.is_string() && kv.first.str() == k) {
        kv.second = v;
        replaced = true;
      }
    }
    if (!replaced) items.emplace_back(Value::string(k), v);
  }
  return items;
}

}  // namespace

bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  // Undefined defines __iter__/__len__/__getitem__, so jinja2 calls it iterable and a sequence.
  if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.is_callable();
  if (name == "sameas") {
    const Value& o = arg0(name, a);
    if (v.is_none() || o.is_none()) return v.is_none() && o.is_none();
    if (v.is_bool() || o.is_bool()) return v.is_bool() && o.is_bool() && v.as_bool() == o.as_bool();
    return v.kind() == o.kind() && v.equals(o) && (v.is_int() || v.is_string());
  }
  if (name == "escaped") return false;
  if (name == "lower")
    return v.is_string() ? all_chars(v.str(), false) : all_chars(v.to_string(), false);
  if (name == "upper")
    return v.is_string() ? all_chars(v.str(), true) : all_chars(v.to_string(), true);
  if (name == "odd" || name == "even") {
    Value r = binary_op(in, "%", v, Value::integer(2));
    return r.truthy() == (name == "odd");
  }
  if (name == "divisibleby") {
    Value r = binary_op(in, "%", v, arg0(name, a));
    return !r.truthy();
  }
  if (name == "eq" || name == "equalto" || name == "==") return compare_op("==", v, arg0(name, a));
  if (name == "ne" || name == "!=") return compare_op("!=", v, arg0(name, a));
  if (name == "lt" || name == "lessthan" || name == "<") return compare_op("<", v, arg0(name, a));
  if (name == "le" || name == "<=") return compare_op("<=", v, arg0(name, a));
  if (name == "gt" || name == "greaterthan" || name == ">")
    return compare_op(">", v, arg0(name, a));
  if (name == "ge" || name == ">=") return compare_op(">=", v, arg0(name, a));
  if (name == "in") return contains(arg0(name, a), v);
  throw Error("no test named '" + name + "'");
}

std::vector<std::pair<std::string, Value>> make_globals(Interpreter&) {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", Value::callable("range", range_fn));
  g.emplace_back("namespace", Value::callable("namespace", [](CallArgs& a) {
                   return Value::name_space(kwargs_to_items(a, 1, "namespace"));
                 }));
  g.emplace_back("dict", Value::callable("dict", [](CallArgs& a) {
                   return Value::dict(kwargs_to_items(a, 1, "dict"));
                 }));
  g.emplace_back("raise_exception", Value::callable("raise_exception", [](CallArgs& a) -> Value {
                   throw Error(a.get_or(0, "message", Value::string("")).to_string());
                 }));
  g.emplace_back("strftime_now", Value::callable("strftime_now", [](CallArgs& a) {
                   std::string fmt = a.get_or(0, "format", Value::string("")).to_string();
                   std::time_t now = std::time(nullptr);
                   std::tm local{};
                   localtime_r(&now, &local);
                   char buf[512];
                   size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &local);
                   if (n == 0 && !fmt.empty())
                     throw Error("strftime_now: format produced no output or is too long");
                   return Value::string(std::string(buf, n));
                 }));
  return g;
}

}  // namespace attnres::jinja
