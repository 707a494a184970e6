// jinja2's built-in filters, plus transformers' `tojson` override (json.dumps with
// ensure_ascii=False). Filters that return generators in jinja2 (map, select, ...)
// return lists here; templates only iterate or join them.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "engine/core/error.h"
#include "engine/jinja/jinja_builtins.h"
#include "engine/jinja/jinja_json.h"
#include "engine/jinja/jinja_utf8.h"

namespace attnres::jinja {
namespace {

// jinja2's make_attrgetter: "a.b.0" walks attributes/items.
Value attr_path(Interpreter& in, Value v, const std::string& path) {
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = numeric ? in.getitem(v, Value::integer(std::stoll(part)))
                : in.getitem(v, Value::string(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

Value lower_if_string(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value::string(utf8::lower(v.str())) : v;
}

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(utf8::length(v.str()));
    case Value::Kind::kList:
      return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict_items().size());
    default:
      throw Error("object of type '" + v.type_name() + "' has no len()");
  }
}

std::string jinja_title(const std::string& s) {
  // re.split(r"([-\s({\[<]+)", s), then item[0].upper() + item[1:].lower() per piece.
  std::vector<char32_t> cps = utf8::decode(s);
  auto is_sep = [](char32_t c) {
    return utf8::is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  bool at_start = true;
  for (char32_t c : cps) {
    if (is_sep(c)) {
      utf8::append(out, c);
      at_start = true;
    } else {
      utf8::append(out, at_start ? utf8::to_upper(c) : utf8::to_lower(c));
      at_start = false;
    }
  }
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Python str.splitlines() separators, for the indent filter.
std::vector<std::string> split_lines(const std::string& s) {
  std::vector<std::string> lines;
  std::vector<char32_t> cps = utf8::decode(s);
  std::string cur;
  for (size_t i = 0; i < cps.size(); ++i) {
    char32_t c = cps[i];
    bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
               c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      utf8::append(cur, c);
      continue;
    }
    if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
    lines.push_back(cur);
    cur.clear();
  }
  if (!cur.empty()) lines.push_back(cur);
  return lines;
}

Value do_indent(const Value& v, CallArgs& a) {
  a.check("indent", 3, {"width", "first", "blank"});
  Value width = a.get_or(0, "width", Value::integer(4));
  std::string ind =
      width.is_string()
          ? width.str()
          : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
  bool first = a.get_or(1, "first", Value::boolean(false)).truthy();
  bool blank = a.get_or(2, "blank", Value::boolean(false)).truthy();
  std::vector<std::string> lines = split_lines(v.to_string() + "\n");
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) rv += (i ? "\n" + ind : "") + lines[i];
  } else {
    rv = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (lines[i].empty() ? "" : ind + lines[i]);
  }
  return Value::string(first ? ind + rv : rv);
}

Value do_tojson(const Value& v, CallArgs& a) {
  a.check("tojson", 4, {"ensure_ascii", "indent", "separators", "sort_keys"});
  DumpOptions o;
  o.ensure_ascii = a.get_or(0, "ensure_ascii", Value::boolean(false)).truthy();
  Value indent = a.get_or(1, "indent", Value::none());
  if (indent.is_string())
    o.indent = indent.str();
  else if (indent.is_int())
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(0, indent.as_int())), ' ');
  else if (!indent.is_none())
    throw Error("tojson: indent must be an integer or a string");
  if (o.indent) o.item_separator = ",";
  Value seps = a.get_or(2, "separators", Value::none());
  if (seps.is_list() && seps.items().size() == 2 && seps.items()[0].is_string() &&
      seps.items()[1].is_string()) {
    o.item_separator = seps.items()[0].str();
    o.key_separator = seps.items()[1].str();
  } else if (!seps.is_none()) {
    throw Error("tojson: separators must be a (item_separator, key_separator) pair");
  }
  o.sort_keys = a.get_or(3, "sort_keys", Value::boolean(false)).truthy();
  return Value::string(dumps(v, o));
}

Value do_round(const Value& v, CallArgs& a) {
  a.check("round", 2, {"precision", "method"});
  int64_t precision = a.get_or(0, "precision", Value::integer(0)).as_int();
  std::string method = a.get_or(1, "method", Value::string("common")).to_string();
  if (!v.is_number()) throw Error("round: value must be a number, not " + v.type_name());
  if (method == "common") {
    if (!v.is_float()) return Value::integer(v.as_int());
    // Python's round() is correctly rounded (half to even on the exact binary value),
    // which is what printf's %.*f does too.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f",
                  static_cast<int>(std::clamp<int64_t>(precision, 0, 300)), v.as_double());
    return Value::floating(std::strtod(buf, nullptr));
  }
  if (method != "ceil" && method != "floor") throw Error("method must be common, ceil or floor");
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_double() * scale;
  return Value::floating((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
}

Value do_int(const Value& v, CallArgs& a) {
  a.check("int", 2, {"default", "base"});
  Value fallback = a.get_or(0, "default", Value::integer(0));
  int base = static_cast<int>(a.get_or(1, "base", Value::integer(10)).as_int());
  if (v.is_number())
    return Value::integer(v.is_float() ? static_cast<int64_t>(v.as_double()) : v.as_int());
  if (v.is_string()) {
    std::string s = utf8::strip(v.str(), nullptr, true, true);
    char* end = nullptr;
    errno = 0;
    long long r = std::strtoll(s.c_str(), &end, base);
    if (!s.empty() && end && *end == 0 && errno == 0) return Value::integer(r);
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == 0 && std::isfinite(d))
      return Value::integer(static_cast<int64_t>(d));
  }
  return fallback;
}

Value do_float(const Value& v, CallArgs& a) {
  a.check("float", 1, {"default"});
  if (v.is_number()) return Value::floating(v.as_double());
  if (v.is_string()) {
    std::string s = utf8::strip(v.str(), nullptr, true, true);
    char* end = nullptr;
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == 0) return Value::floating(d);
  }
  return a.get_or(0, "default", Value::floating(0.0));
}

ValueList sorted(Interpreter& in, ValueList items, bool reverse, bool case_sensitive,
                 const Value& attribute) {
  auto key = [&](const Value& x) {
    Value k = attribute.is_none() ? x : attr_path(in, x, attribute.to_string());
    return lower_if_string(k, case_sensitive);
  };
  std::vector<std::pair<Value, Value>> keyed;
  for (auto& x : items) keyed.emplace_back(key(x), x);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& l, const auto& r) {
    return reverse ? less_than(r.first, l.first) : less_than(l.first, r.first);
  });
  ValueList out;
  for (auto& kv : keyed) out.push_back(kv.second);
  return out;
}

// select/reject/selectattr/rejectattr share jinja2's prepare_select_or_reject.
Value select_or_reject(Interpreter& in, const Value& v, CallArgs& a, bool use_attr, bool keep) {
  ValueList out;
  size_t next = 0;
  std::string attr;
  if (use_attr) {
    if (a.args.empty()) throw Error("Missing parameter for attribute name");
    attr = a.args[next++].to_string();
  }
  std::string test_name;
  if (next < a.args.size()) test_name = a.args[next++].to_string();
  CallArgs test_args;
  test_args.args.assign(a.args.begin() + static_cast<long>(std::min(next, a.args.size())),
                        a.args.end());
  test_args.kwargs = a.kwargs;
  for (const Value& item : iterate(v)) {
    Value subject = use_attr ? attr_path(in, item, attr) : item;
    bool ok = test_name.empty() ? subject.truthy() : in.test(test_name, subject, test_args);
    if (ok == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value do_map(Interpreter& in, const Value& v, CallArgs& a) {
  ValueList out;
  const Value* attribute = nullptr;
  for (const auto& [k, val] : a.kwargs)
    if (k == "attribute") attribute = &val;
  if (attribute) {
    Value fallback = a.get_or(99, "default", Value());
    for (const Value& item : iterate(v)) {
      Value r = attr_path(in, item, attribute->to_string());
      out.push_back(r.is_undefined() && !fallback.is_undefined() ? fallback : r);
    }
    return Value::list(std::move(out));
  }
  if (a.args.empty()) throw Error("map requires a filter argument");
  std::string name = a.args[0].to_string();
  CallArgs rest;
  rest.args.assign(a.args.begin() + 1, a.args.end());
  rest.kwargs = a.kwargs;
  for (const Value& item : iterate(v)) {
    CallArgs copy = rest;
    out.push_back(in.filter(name, item, copy));
  }
  return Value::list(std::move(out));
}

}  // namespace

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& a) {
  if (name == "tojson") return do_tojson(v, a);
  if (name == "trim") {
    Value chars = a.get_or(0, "chars", Value::none());
    return Value::string(
        utf8::strip(v.to_string(), chars.is_none() ? nullptr : &chars.str(), true, true));
  }
  if (name == "length" || name == "count") return Value::integer(length_of(v));
  if (name == "string") return Value::string(v.to_string());
  if (name == "upper") return Value::string(utf8::upper(v.to_string()));
  if (name == "lower") return Value::string(utf8::lower(v.to_string()));
  if (name == "title") return Value::string(jinja_title(v.to_string()));
  if (name == "capitalize")
    return method_of(in, Value::string(v.to_string()), "capitalize").fn().fn(a);
  if (name == "replace") {
    Value s = Value::string(v.to_string());
    return in.call(method_of(in, s, "replace"), a);
  }
  if (name == "default" || name == "d") {
    bool boolean = a.get_or(1, "boolean", Value::boolean(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy()))
      return a.get_or(0, "default_value", Value::string(""));
    return v;
  }
  if (name == "first") {
    ValueList items = iterate(v);
    return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
  }
  if (name == "last") {
    ValueList items = iterate(v);
    return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
  }
  if (name == "list") return Value::list(iterate(v));
  if (name == "join") {
    std::string sep = a.get_or(0, "d", Value::string("")).to_string();
    Value attribute = a.get_or(1, "attribute", Value::none());
    std::string out;
    ValueList items = iterate(v);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i) out += sep;
      out += (attribute.is_none() ? items[i] : attr_path(in, items[i], attribute.to_string()))
                 .to_string();
      in.check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "int") return do_int(v, a);
  if (name == "float") return do_float(v, a);
  if (name == "abs") {
    if (v.is_float()) return Value::floating(std::fabs(v.as_double()));
    if (v.is_number()) return Value::integer(std::llabs(v.as_int()));
    throw Error("bad operand type for abs(): '" + v.type_name() + "'");
  }
  if (name == "round") return do_round(v, a);
  if (name == "items") {
    if (v.is_undefined()) return Value::list();
    if (!v.is_dict()) throw Error("Can only get item pairs from a mapping.");
    return in.call(method_of(in, v, "items"), a);
  }
  if (name == "dictsort") {
    if (!v.is_dict()) throw Error("dictsort: value must be a mapping");
    bool cs = a.get_or(0, "case_sensitive", Value::boolean(false)).truthy();
    std::string by = a.get_or(1, "by", Value::string("key")).to_string();
    bool reverse = a.get_or(2, "reverse", Value::boolean(false)).truthy();
    ValueList pairs;
    for (const auto& [k, val] : v.dict_items()) pairs.push_back(Value::list({k, val}, true));
    Value attr = Value::string(by == "value" ? "1" : "0");
    return Value::list(sorted(in, pairs, reverse, cs, attr));
  }
  if (name == "sort") {
    bool reverse = a.get_or(0, "reverse", Value::boolean(false)).truthy();
    bool cs = a.get_or(1, "case_sensitive", Value::boolean(false)).truthy();
    return Value::list(
        sorted(in, iterate(v), reverse, cs, a.get_or(2, "attribute", Value::none())));
  }
  if (name == "unique") {
    bool cs = a.get_or(0, "case_sensitive", Value::boolean(false)).truthy();
    Value attribute = a.get_or(1, "attribute", Value::none());
    ValueList out, seen;
    for (const Value& item : iterate(v)) {
      Value key = lower_if_string(
          attribute.is_none() ? item : attr_path(in, item, attribute.to_string()), cs);
      bool dup = false;
      for (const Value& s : seen) dup = dup || s.equals(key);
      if (!dup) {
        seen.push_back(key);
        out.push_back(item);
      }
    }
    return Value::list(std::move(out));
  }
  if (name == "reverse") {
    if (v.is_string()) return slice_value(v, Value::none(), Value::none(), Value::integer(-1));
    ValueList items = iterate(v);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "select" || name == "reject")
    return select_or_reject(in, v, a, false, name == "select");
  if (name == "selectattr" || name == "rejectattr") {
    return select_or_reject(in, v, a, true, name == "selectattr");
  }
  if (name == "map") return do_map(in, v, a);
  if (name == "attr") return in.getattr(v, a.get_or(0, "name", Value::string("")).to_string());
  if (name == "safe") return v;
  if (name == "escape" || name == "e" || name == "forceescape")
    return Value::string(html_escape(v.to_string()));
  if (name == "indent") return do_indent(v, a);
  if (name == "center") {
    int64_t width = a.get_or(0, "width", Value::integer(80)).as_int();
    std::string s = v.to_string();
    int64_t len = static_cast<int64_t>(utf8::length(s));
    if (width <= len) return Value::string(s);
    int64_t pad = width - len;
    int64_t left = pad / 2 + (pad & width & 1);  // CPython's pad split
    return Value::string(std::string(static_cast<size_t>(left), ' ') + s +
                         std::string(static_cast<size_t>(pad - left), ' '));
  }
  if (name == "wordcount") {
    int64_t n = 0;
    bool in_word = false;
    for (char32_t c : utf8::decode(v.to_string())) {
      bool w = utf8::is_alnum(c) || c == '_';
      if (w && !in_word) ++n;
      in_word = w;
    }
    return Value::integer(n);
  }
  if (name == "sum") {
    Value attribute = a.get_or(0, "attribute", Value::none());
    Value total = a.get_or(1, "start", Value::integer(0));
    for (const Value& item : iterate(v)) {
      total = binary_op(in, "+", total,
                        attribute.is_none() ? item : attr_path(in, item, attribute.to_string()));
    }
    return total;
  }
  if (name == "min" || name == "max") {
    bool cs = a.get_or(0, "case_sensitive", Value::boolean(false)).truthy();
    ValueList items =
        sorted(in, iterate(v), name == "max", cs, a.get_or(1, "attribute", Value::none()));
    return items.empty() ? Value::undefined("No aggregated item, sequence was empty.")
                         : items.front();
  }
  throw Error("no filter named '" + name + "'");
}

}  // namespace attnres::jinja
