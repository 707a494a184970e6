// Python operator semantics (arithmetic, comparison, membership, iteration, indexing) for
// the Jinja interpreter, with Python's TypeError cases turned into attnres::Error.
#include <cmath>
#include <limits>

#include "engine/core/error.h"
#include "engine/jinja/jinja_builtins.h"
#include "engine/jinja/jinja_interpreter.h"
#include "engine/jinja/jinja_utf8.h"

namespace attnres::jinja {
namespace {

[[noreturn]] void unsupported(const std::string& op, const Value& l, const Value& r) {
  throw Error("unsupported operand type(s) for " + op + ": '" + l.type_name() + "' and '" +
              r.type_name() + "'");
}

[[noreturn]] void overflow() {
  throw Error("integer overflow (the template engine uses 64-bit integers)");
}

int64_t add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) overflow();
  return r;
}
int64_t sub(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_sub_overflow(a, b, &r)) overflow();
  return r;
}
int64_t mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) overflow();
  return r;
}

int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) throw Error("integer division or modulo by zero");
  if (a == std::numeric_limits<int64_t>::min() && b == -1) overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t py_mod(int64_t a, int64_t b) {
  if (b == 0) throw Error("integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

Value repeat(Interpreter& in, const Value& seq, int64_t n) {
  if (n <= 0) return seq.is_string() ? Value::string("") : Value::list({}, seq.is_tuple());
  if (seq.is_string()) {
    in.check_size(seq.str().size() * static_cast<size_t>(n));
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value::string(std::move(out));
  }
  in.check_size(seq.items().size() * static_cast<size_t>(n));
  ValueList out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.items().begin(), seq.items().end());
  return Value::list(std::move(out), seq.is_tuple());
}

bool is_int_like(const Value& v) { return v.is_int() || v.is_bool(); }

}  // namespace

[[noreturn]] void undefined_error(const Value& v) {
  throw Error(v.undefined_hint().empty() ? "undefined value" : v.undefined_hint());
}

Value binary_op(Interpreter& in, const std::string& op, const Value& l, const Value& r) {
  if (op == "~") {
    std::string s = l.to_string() + r.to_string();
    in.check_size(s.size());
    return Value::string(std::move(s));
  }
  if (l.is_undefined()) undefined_error(l);
  if (r.is_undefined()) undefined_error(r);
  const bool ints = is_int_like(l) && is_int_like(r);
  const bool nums = l.is_number() && r.is_number();
  int64_t a = nums ? l.as_int() : 0, b = nums ? r.as_int() : 0;
  if (op == "+") {
    if (ints) return Value::integer(add(a, b));
    if (nums) return Value::floating(l.as_double() + r.as_double());
    if (l.is_string() && r.is_string()) {
      in.check_size(l.str().size() + r.str().size());
      return Value::string(l.str() + r.str());
    }
    if (l.is_list() && r.is_list() && l.is_tuple() == r.is_tuple()) {
      ValueList out = l.items();
      out.insert(out.end(), r.items().begin(), r.items().end());
      return Value::list(std::move(out), l.is_tuple());
    }
    if (l.is_string()) {
      throw Error("can only concatenate str (not \"" + r.type_name() + "\") to str");
    }
    if (l.is_list() && !l.is_tuple()) {
      throw Error("can only concatenate list (not \"" + r.type_name() + "\") to list");
    }
    unsupported("+", l, r);
  }
  if (op == "-") {
    if (ints) return Value::integer(sub(a, b));
    if (nums) return Value::floating(l.as_double() - r.as_double());
    unsupported("-", l, r);
  }
  if (op == "*") {
    if (ints) return Value::integer(mul(a, b));
    if (nums) return Value::floating(l.as_double() * r.as_double());
    if ((l.is_string() || l.is_list()) && is_int_like(r)) return repeat(in, l, r.as_int());
    if ((r.is_string() || r.is_list()) && is_int_like(l)) return repeat(in, r, l.as_int());
    unsupported("*", l, r);
  }
  if (op == "/") {
    if (!nums) unsupported("/", l, r);
    if (r.as_double() == 0.0) throw Error("division by zero");
    return Value::floating(l.as_double() / r.as_double());
  }
  if (op == "//") {
    if (ints) return Value::integer(floor_div(a, b));
    if (!nums) unsupported("//", l, r);
    if (r.as_double() == 0.0) throw Error("float floor division by zero");
    return Value::floating(std::floor(l.as_double() / r.as_double()));
  }
  if (op == "%") {
    if (ints) return Value::integer(py_mod(a, b));
    if (l.is_string()) throw Error("printf-style string formatting (%) is not supported");
    if (!nums) unsupported("%", l, r);
    double x = l.as_double(), y = r.as_double();
    if (y == 0.0) throw Error("float modulo");
    double m = std::fmod(x, y);
    if (m != 0.0 && ((m < 0) != (y < 0))) m += y;
    return Value::floating(m);
  }
  if (op == "**") {
    if (ints && b >= 0) {
      int64_t result = 1, base = a;
      for (int64_t e = b; e > 0; e >>= 1) {
        if (e & 1) result = mul(result, base);
        if (e > 1) base = mul(base, base);
      }
      return Value::integer(result);
    }
    if (!nums) unsupported("** or pow()", l, r);
    if (l.as_double() == 0.0 && r.as_double() < 0) {
      throw Error("0.0 cannot be raised to a negative power");
    }
    return Value::floating(std::pow(l.as_double(), r.as_double()));
  }
  throw Error("unknown operator " + op);
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order = code points
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const ValueList &x = a.items(), &y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!x[i].equals(y[i])) return less_than(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  if (a.is_undefined()) undefined_error(a);
  if (b.is_undefined()) undefined_error(b);
  throw Error("'<' not supported between instances of '" + a.type_name() + "' and '" +
              b.type_name() + "'");
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        throw Error("'in <string>' requires string as left operand, not " + item.type_name());
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.items()) {
        if (v.equals(item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return container.find(item) != nullptr;
    case Value::Kind::kUndefined:
      return false;  // jinja2's Undefined iterates as empty
    default:
      throw Error("argument of type '" + container.type_name() + "' is not iterable");
  }
}

bool compare_op(const std::string& op, const Value& l, const Value& r) {
  if (op == "==") return l.equals(r);
  if (op == "!=") return !l.equals(r);
  if (op == "<") return less_than(l, r);
  if (op == ">") return less_than(r, l);
  if (op == "<=") return less_than(l, r) || l.equals(r);
  if (op == ">=") return less_than(r, l) || l.equals(r);
  if (op == "in") return contains(r, l);
  if (op == "not in") return !contains(r, l);
  throw Error("unknown comparison " + op);
}

ValueList iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.items();
    case Value::Kind::kDict: {
      ValueList keys;
      for (const auto& kv : v.dict_items()) keys.push_back(kv.first);
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      std::vector<size_t> b = utf8::boundaries(v.str());
      for (size_t i = 0; i + 1 < b.size(); ++i) {
        chars.push_back(Value::string(v.str().substr(b[i], b[i + 1] - b[i])));
      }
      return chars;
    }
    default:
      throw Error("'" + v.type_name() + "' object is not iterable");
  }
}

Value slice_value(const Value& obj, const Value& start_v, const Value& stop_v,
                  const Value& step_v) {
  if (obj.is_undefined()) undefined_error(obj);
  if (!obj.is_string() && !obj.is_list()) {
    throw Error("'" + obj.type_name() + "' object is not subscriptable");
  }
  auto as_index = [](const Value& v) {
    if (!v.is_none() && !is_int_like(v)) {
      throw Error("slice indices must be integers or None");
    }
  };
  as_index(start_v);
  as_index(stop_v);
  as_index(step_v);
  std::vector<size_t> bounds;
  int64_t len;
  if (obj.is_string()) {
    bounds = utf8::boundaries(obj.str());
    len = static_cast<int64_t>(bounds.size()) - 1;
  } else {
    len = static_cast<int64_t>(obj.items().size());
  }
  int64_t step = step_v.is_none() ? 1 : step_v.as_int();
  if (step == 0) throw Error("slice step cannot be zero");
  // CPython's PySlice_AdjustIndices.
  auto adjust = [&](const Value& v, int64_t def) {
    if (v.is_none()) return def;
    int64_t i = v.as_int();
    if (i < 0) {
      i += len;
      if (i < 0) i = step < 0 ? -1 : 0;
    } else if (i >= len) {
      i = step < 0 ? len - 1 : len;
    }
    return i;
  };
  int64_t start = adjust(start_v, step < 0 ? len - 1 : 0);
  int64_t stop = adjust(stop_v, step < 0 ? -1 : len);
  std::vector<int64_t> picks;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) picks.push_back(i);
  if (obj.is_string()) {
    std::string out;
    for (int64_t i : picks) out += obj.str().substr(bounds[i], bounds[i + 1] - bounds[i]);
    return Value::string(std::move(out));
  }
  ValueList out;
  for (int64_t i : picks) out.push_back(obj.items()[static_cast<size_t>(i)]);
  return Value::list(std::move(out), obj.is_tuple());
}

Value get_item(Interpreter& in, const Value& obj, const Value& key) {
  if (obj.is_undefined()) undefined_error(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && is_int_like(key)) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      int64_t n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.items()[static_cast<size_t>(i)];
    } else {
      std::vector<size_t> b = utf8::boundaries(obj.str());
      int64_t n = static_cast<int64_t>(b.size()) - 1;
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::string(obj.str().substr(b[i], b[i + 1] - b[i]));
    }
  }
  if (key.is_string()) {
    Value m = method_of(in, obj, key.str());
    if (!m.is_undefined()) return m;
    if (obj.is_namespace()) {
      if (const Value* v = obj.find(key.str())) return *v;
    }
  }
  std::string what = obj.is_dict() ? "dict object" : obj.type_name() + " object";
  return Value::undefined("'" + what + "' has no attribute " + key.repr());
}

Value get_attribute(Interpreter& in, const Value& obj, const std::string& name) {
  if (obj.is_undefined()) undefined_error(obj);
  Value m = method_of(in, obj, name);
  if (!m.is_undefined()) return m;
  if (obj.is_dict() || obj.is_namespace()) {
    if (const Value* v = obj.find(name)) return *v;
  }
  if (obj.is_none()) return Value::undefined("'None' has no attribute '" + name + "'");
  std::string what = obj.is_dict() ? "dict object" : obj.type_name() + " object";
  return Value::undefined("'" + what + "' has no attribute '" + name + "'");
}

}  // namespace attnres::jinja
