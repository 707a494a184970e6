// The value model of the Jinja interpreter: a small dynamic type that mirrors the Python
// objects jinja2 works with (None, bool, int, float, str, list/tuple, dict, Undefined,
// namespace, callables), so that printing, comparison and truthiness match Python exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace attnres::jinja {

class Value;
struct CallArgs;
using ValueList = std::vector<Value>;
// Insertion-ordered like a Python dict; keys are compared with Python equality.
using DictItems = std::vector<std::pair<Value, Value>>;
using NativeFn = std::function<Value(CallArgs&)>;

struct Callable {
  std::string name;
  NativeFn fn;
};

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable
  };

  Value() = default;  // Undefined
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double d);
  static Value string(std::string s);
  static Value list(ValueList items = {}, bool is_tuple = false);
  // dict.items()/keys()/values(): a list that prints as Python's view, e.g. dict_items([...]).
  static Value dict_view(ValueList items, std::string view_name);
  static Value dict(DictItems items = {});
  static Value name_space(DictItems items = {});
  static Value callable(std::string name, NativeFn fn);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // Python's numbers.Number: bool counts, like isinstance(True, int).
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && is_tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return is_bool() ? (b_ ? 1 : 0) : i_; }
  double as_double() const { return is_float() ? f_ : static_cast<double>(as_int()); }
  const std::string& str() const { return *s_; }
  const ValueList& items() const { return *list_; }
  const DictItems& dict_items() const { return *dict_; }
  // Namespaces are the one mutable object a template may change ({% set ns.x = 1 %}).
  DictItems& namespace_items() const { return *dict_; }
  const Callable& fn() const { return *fn_; }
  const std::string& undefined_hint() const { return *s_; }

  // Python truthiness: empty containers, 0, "", None and Undefined are false.
  bool truthy() const;
  // Python str(): what {{ value }} prints.
  std::string to_string() const;
  // Python repr(): how the value prints inside a list or dict.
  std::string repr() const;
  // Python ==, including 1 == 1.0 == True and deep container equality.
  bool equals(const Value& other) const;
  // Python type name for messages ("str", "int", "dict", ...).
  std::string type_name() const;

  // Dict lookup by key (Python equality); nullptr when absent.
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool is_tuple_ = false;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  std::shared_ptr<const std::string> s_ = std::make_shared<const std::string>();
  std::shared_ptr<const ValueList> list_;
  std::shared_ptr<DictItems> dict_;
  std::shared_ptr<const Callable> fn_;
};

// Positional and keyword arguments of a call, with helpers that mirror Python's binding.
struct CallArgs {
  ValueList args;
  std::vector<std::pair<std::string, Value>> kwargs;

  // Argument `name` at position `pos` (or keyword); nullptr if not given.
  const Value* get(size_t pos, const std::string& name) const;
  Value get_or(size_t pos, const std::string& name, Value fallback) const;
  // Throws when more positional arguments than `max_positional` or unknown keywords.
  void check(const std::string& func, size_t max_positional,
             std::initializer_list<const char*> known_kwargs) const;
};

// Python float repr (shortest round-trip, "1.0", "1e-05", "inf").
std::string python_float_repr(double d);
// Python repr of a str: quotes chosen and characters escaped the way Python does.
std::string python_string_repr(const std::string& s);

}  // namespace attnres::jinja
