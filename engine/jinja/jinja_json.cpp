#include "engine/jinja/jinja_json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "engine/core/error.h"
#include "engine/jinja/jinja_interpreter.h"
#include "engine/jinja/jinja_utf8.h"

namespace attnres::jinja {
namespace {

template <typename Json>
Value convert(const Json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::floating(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::floating(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(convert(e));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      DictItems items;
      items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        items.emplace_back(Value::string(it.key()), convert(it.value()));
      }
      return Value::dict(std::move(items));
    }
    default:
      throw Error("unsupported JSON value in chat template context");
  }
}

void escape_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (char32_t c : utf8::decode(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default: {
        char buf[16];
        if (c < 0x20) {
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else if (ensure_ascii && c > 0x7E) {
          if (c >= 0x10000) {
            unsigned v = static_cast<unsigned>(c) - 0x10000;
            std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                          0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          }
          out += buf;
        } else {
          utf8::append(out, c);
        }
      }
    }
  }
  out += '"';
}

std::string float_text(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  return python_float_repr(d);
}

std::string key_text(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString:
      return k.str();
    case Value::Kind::kBool:
      return k.as_bool() ? "true" : "false";
    case Value::Kind::kNone:
      return "null";
    case Value::Kind::kInt:
      return std::to_string(k.as_int());
    case Value::Kind::kFloat:
      return float_text(k.as_double());
    default:
      throw Error("keys must be str, int, float, bool or None, not " + k.type_name());
  }
}

class Dumper {
 public:
  explicit Dumper(const DumpOptions& o) : o_(o) {}

  void dump(const Value& v, int level, std::string& out) {
    if (level > 500) throw Error("tojson: value nested too deeply");
    switch (v.kind()) {
      case Value::Kind::kNone:
        out += "null";
        return;
      case Value::Kind::kBool:
        out += v.as_bool() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        out += std::to_string(v.as_int());
        return;
      case Value::Kind::kFloat:
        out += float_text(v.as_double());
        return;
      case Value::Kind::kString:
        escape_string(v.str(), o_.ensure_ascii, out);
        return;
      case Value::Kind::kList: {
        if (v.items().empty()) {
          out += "[]";
          return;
        }
        out += '[';
        for (size_t i = 0; i < v.items().size(); ++i) {
          out += i ? o_.item_separator : "";
          newline(level + 1, out);
          dump(v.items()[i], level + 1, out);
        }
        newline(level, out);
        out += ']';
        return;
      }
      case Value::Kind::kDict: {
        if (v.dict_items().empty()) {
          out += "{}";
          return;
        }
        std::vector<std::pair<std::string, const Value*>> entries;
        for (const auto& [k, val] : v.dict_items()) entries.emplace_back(key_text(k), &val);
        if (o_.sort_keys) {
          std::stable_sort(entries.begin(), entries.end(),
                           [](const auto& a, const auto& b) { return a.first < b.first; });
        }
        out += '{';
        for (size_t i = 0; i < entries.size(); ++i) {
          out += i ? o_.item_separator : "";
          newline(level + 1, out);
          escape_string(entries[i].first, o_.ensure_ascii, out);
          out += o_.key_separator;
          dump(*entries[i].second, level + 1, out);
        }
        newline(level, out);
        out += '}';
        return;
      }
      default:
        throw Error("Object of type " + v.type_name() + " is not JSON serializable");
    }
  }

 private:
  void newline(int level, std::string& out) {
    if (!o_.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *o_.indent;
  }

  const DumpOptions& o_;
};

}  // namespace

Value from_json(const nlohmann::json& j) { return convert(j); }
Value from_json(const nlohmann::ordered_json& j) { return convert(j); }

std::string dumps(const Value& v, const DumpOptions& options) {
  std::string out;
  Dumper(options).dump(v, 0, out);
  return out;
}

}  // namespace attnres::jinja
