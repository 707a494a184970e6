// Python methods reachable from templates: str methods (split, strip, startswith, ...),
// read-only dict/list methods. Mutating methods are refused the way transformers'
// ImmutableSandboxedEnvironment refuses them.
#include <algorithm>

#include "engine/core/error.h"
#include "engine/jinja/jinja_builtins.h"
#include "engine/jinja/jinja_utf8.h"

namespace attnres::jinja {
namespace {

const std::string& want_str(const Value& v, const std::string& what) {
  if (!v.is_string()) {
    throw Error(what + " must be str, not " + v.type_name());
  }
  return v.str();
}

// Byte offset → code point index, for find()/index() results.
int64_t cp_index(const std::string& s, size_t byte_pos) {
  return static_cast<int64_t>(utf8::length(s.substr(0, byte_pos)));
}

bool is_cased(char32_t c) {
  return utf8::is_upper(c) || utf8::is_lower(c) || utf8::to_upper(c) != c || utf8::to_lower(c) != c;
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : utf8::decode(s)) {
    utf8::append(out, prev_cased ? utf8::to_lower(c) : utf8::to_title(c));
    prev_cased = is_cased(c);
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::vector<char32_t> cps = utf8::decode(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    utf8::append(out, i == 0 ? utf8::to_title(cps[i]) : utf8::to_lower(cps[i]));
  }
  return out;
}

ValueList split_whitespace(const std::string& s, int64_t maxsplit) {
  std::vector<char32_t> cps = utf8::decode(s);
  ValueList out;
  size_t i = 0, n = cps.size();
  while (true) {
    while (i < n && utf8::is_space(cps[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(Value::string(utf8::encode({cps.begin() + i, cps.end()})));
      break;
    }
    size_t start = i;
    while (i < n && !utf8::is_space(cps[i])) ++i;
    out.push_back(Value::string(utf8::encode({cps.begin() + start, cps.begin() + i})));
  }
  return out;
}

ValueList split_sep(const std::string& s, const std::string& sep, int64_t maxsplit, bool right) {
  if (sep.empty()) throw Error("empty separator");
  std::vector<std::string> parts;
  if (!right) {
    size_t pos = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      size_t hit = s.find(sep, pos);
      if (hit == std::string::npos) break;
      parts.push_back(s.substr(pos, hit - pos));
      pos = hit + sep.size();
    }
    parts.push_back(s.substr(pos));
  } else {
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < sep.size()) break;
      size_t hit = s.rfind(sep, end - sep.size());
      if (hit == std::string::npos) break;
      parts.push_back(s.substr(hit + sep.size(), end - hit - sep.size()));
      end = hit;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
  }
  ValueList out;
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& repl,
                       int64_t count) {
  std::string out;
  if (old.empty()) {
    std::vector<size_t> b = utf8::boundaries(s);
    int64_t done = 0;
    for (size_t i = 0; i + 1 < b.size(); ++i) {
      if (count < 0 || done < count) {
        out += repl;
        ++done;
      }
      out += s.substr(b[i], b[i + 1] - b[i]);
    }
    if (count < 0 || done < count) out += repl;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string::npos) break;
    out += s.substr(pos, hit - pos) + repl;
    pos = hit + old.size();
    ++done;
  }
  return out + s.substr(pos);
}

bool prefix_match(const Value& arg, const std::string& s, bool suffix) {
  auto one = [&](const std::string& p) {
    if (p.size() > s.size()) return false;
    return suffix ? s.compare(s.size() - p.size(), p.size(), p) == 0
                  : s.compare(0, p.size(), p) == 0;
  };
  if (arg.is_list() && arg.is_tuple()) {
    for (const Value& p : arg.items()) {
      if (one(want_str(p, "tuple for startswith/endswith item"))) return true;
    }
    return false;
  }
  return one(want_str(arg, std::string(suffix ? "endswith" : "startswith") + " first arg"));
}

// str.format with positional/named fields; format specs and conversions are not supported.
std::string py_format(const std::string& fmt, const CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}')
        ++i;
      else
        throw Error("Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) throw Error("Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    if (field.find_first_of(":!.[") != std::string::npos) {
      throw Error("str.format: format specs and conversions are not supported");
    }
    const Value* v = nullptr;
    if (field.empty()) {
      v = auto_index < a.args.size() ? &a.args[auto_index] : nullptr;
      ++auto_index;
    } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
      size_t idx = std::stoul(field);
      v = idx < a.args.size() ? &a.args[idx] : nullptr;
    } else {
      for (const auto& [k, val] : a.kwargs)
        if (k == field) v = &val;
    }
    if (!v) throw Error("str.format: missing argument for field '{" + field + "}'");
    out += v->to_string();
    i = close;
  }
  return out;
}

int64_t opt_int(const CallArgs& a, size_t pos, const char* name, int64_t fallback) {
  const Value* v = a.get(pos, name);
  if (!v || v->is_none()) return fallback;
  if (!v->is_int() && !v->is_bool()) throw Error(std::string(name) + " must be an integer");
  return v->as_int();
}

Value string_method(Interpreter& in, const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "upper") return Value::string(utf8::upper(s));
  if (name == "lower") return Value::string(utf8::lower(s));
  if (name == "title") return Value::string(py_title(s));
  if (name == "capitalize") return Value::string(py_capitalize(s));
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = a.get(0, "chars");
    const std::string* set =
        chars && !chars->is_none() ? &want_str(*chars, name + " arg") : nullptr;
    return Value::string(utf8::strip(s, set, name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    if (a.args.empty()) throw Error(name + "() takes at least 1 argument (0 given)");
    return Value::boolean(prefix_match(a.args[0], s, name == "endswith"));
  }
  if (name == "split" || name == "rsplit") {
    const Value* sep = a.get(0, "sep");
    int64_t maxsplit = opt_int(a, 1, "maxsplit", -1);
    if (!sep || sep->is_none()) return Value::list(split_whitespace(s, maxsplit));
    return Value::list(split_sep(s, want_str(*sep, "separator"), maxsplit, name == "rsplit"));
  }
  if (name == "splitlines") {
    ValueList out;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\n' || s[i] == '\r') {
        out.push_back(Value::string(s.substr(start, i - start)));
        if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
        start = i + 1;
      }
    }
    if (start < s.size()) out.push_back(Value::string(s.substr(start)));
    return Value::list(std::move(out));
  }
  if (name == "replace") {
    if (a.args.size() < 2) throw Error("replace() takes at least 2 arguments");
    std::string r = py_replace(s, want_str(a.args[0], "replace arg 1"),
                               want_str(a.args[1], "replace arg 2"), opt_int(a, 2, "count", -1));
    in.check_size(r.size());
    return Value::string(std::move(r));
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    if (a.args.empty()) throw Error(name + "() takes at least 1 argument (0 given)");
    const std::string& sub = want_str(a.args[0], name + " arg");
    size_t hit = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (hit == std::string::npos) {
      if (name.find("index") != std::string::npos) throw Error("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(cp_index(s, hit));
  }
  if (name == "count") {
    if (a.args.empty()) throw Error("count() takes at least 1 argument (0 given)");
    const std::string& sub = want_str(a.args[0], "count arg");
    if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8::length(s)) + 1);
    int64_t n = 0;
    for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size()))
      ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    if (a.args.empty()) throw Error("join() takes exactly one argument (0 given)");
    std::string out;
    ValueList items = iterate(a.args[0]);
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string()) {
        throw Error("sequence item " + std::to_string(i) + ": expected str instance, " +
                    items[i].type_name() + " found");
      }
      if (i) out += s;
      out += items[i].str();
      in.check_size(out.size());
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return Value::string(py_format(s, a));
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string& p = want_str(a.get_or(0, "x", Value::none()), name + " arg");
    bool suffix = name == "removesuffix";
    if (prefix_match(Value::string(p), s, suffix)) {
      return Value::string(suffix ? s.substr(0, s.size() - p.size()) : s.substr(p.size()));
    }
    return Value::string(s);
  }
  auto all_of = [&](bool (*pred)(char32_t)) {
    std::vector<char32_t> cps = utf8::decode(s);
    return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), pred));
  };
  if (name == "isdigit") return all_of(utf8::is_digit);
  if (name == "isalpha") return all_of(utf8::is_alpha);
  if (name == "isalnum") return all_of(utf8::is_alnum);
  if (name == "isspace") return all_of(utf8::is_space);
  if (name == "isupper" || name == "islower") {
    bool want_upper = name == "isupper", any_cased = false;
    for (char32_t c : utf8::decode(s)) {
      if (utf8::is_upper(c) || utf8::is_lower(c)) {
        any_cased = true;
        if (utf8::is_upper(c) != want_upper) return Value::boolean(false);
      }
    }
    return Value::boolean(any_cased);
  }
  throw Error("str has no method " + name);
}

bool is_string_method(const std::string& n) {
  static const char* kNames[] = {
      "upper",        "lower",    "title",   "capitalize", "strip",      "lstrip",  "rstrip",
      "startswith",   "endswith", "split",   "rsplit",     "splitlines", "replace", "find",
      "rfind",        "index",    "rindex",  "count",      "join",       "format",  "removeprefix",
      "removesuffix", "isdigit",  "isalpha", "isalnum",    "isspace",    "isupper", "islower"};
  for (const char* k : kNames)
    if (n == k) return true;
  return false;
}

Value refuse(const Value& obj, const std::string& name) {
  return Value::callable(name, [obj, name](CallArgs&) -> Value {
    throw Error("access to attribute '" + name + "' of '" + obj.type_name() +
                "' object is unsafe (templates cannot modify their inputs)");
  });
}

}  // namespace

Value method_of(Interpreter& in, const Value& obj, const std::string& name) {
  Interpreter* interp = &in;
  if (obj.is_string()) {
    if (!is_string_method(name)) return Value::undefined();
    return Value::callable(name, [interp, obj, name](CallArgs& a) {
      return string_method(*interp, obj.str(), name, a);
    });
  }
  if (obj.is_dict()) {
    if (name == "get") {
      return Value::callable(name, [obj](CallArgs& a) {
        if (a.args.empty()) throw Error("get expected at least 1 argument, got 0");
        const Value* v = obj.find(a.args[0]);
        return v ? *v : a.get_or(1, "default", Value::none());
      });
    }
    if (name == "items" || name == "keys" || name == "values") {
      return Value::callable(name, [obj, name](CallArgs&) {
        ValueList out;
        for (const auto& [k, v] : obj.dict_items()) {
          if (name == "items")
            out.push_back(Value::list({k, v}, true));
          else
            out.push_back(name == "keys" ? k : v);
        }
        return Value::dict_view(std::move(out), "dict_" + name);
      });
    }
    if (name == "copy")
      return Value::callable(name, [obj](CallArgs&) { return Value::dict(obj.dict_items()); });
    if (name == "pop" || name == "popitem" || name == "setdefault" || name == "update" ||
        name == "clear") {
      return refuse(obj, name);
    }
    return Value::undefined();
  }
  if (obj.is_list()) {
    if (name == "index" || name == "count") {
      return Value::callable(name, [obj, name](CallArgs& a) {
        if (a.args.empty()) throw Error(name + "() takes exactly one argument (0 given)");
        int64_t n = 0;
        for (size_t i = 0; i < obj.items().size(); ++i) {
          if (!obj.items()[i].equals(a.args[0])) continue;
          if (name == "index") return Value::integer(static_cast<int64_t>(i));
          ++n;
        }
        if (name == "index") throw Error(a.args[0].repr() + " is not in list");
        return Value::integer(n);
      });
    }
    if (name == "copy" && !obj.is_tuple()) {
      return Value::callable(name, [obj](CallArgs&) { return Value::list(obj.items()); });
    }
    if (!obj.is_tuple() &&
        (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
         name == "remove" || name == "reverse" || name == "sort" || name == "clear")) {
      return refuse(obj, name);
    }
  }
  return Value::undefined();
}

}  // namespace attnres::jinja
