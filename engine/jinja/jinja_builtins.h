// Built-in behaviour of jinja2 as transformers configures it: globals, filters, tests,
// attribute/item access with the ImmutableSandboxedEnvironment rules, and Python methods
// on str/dict/list.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "engine/jinja/jinja_interpreter.h"
#include "engine/jinja/jinja_value.h"

namespace attnres::jinja {

// range, namespace, dict, raise_exception, strftime_now.
std::vector<std::pair<std::string, Value>> make_globals(Interpreter& in);

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, CallArgs& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& v, CallArgs& args);

// jinja2 sandbox getattr/getitem: methods first for `.name`, items first for `[key]`,
// missing → Undefined; mutating methods are refused like ImmutableSandboxedEnvironment.
Value get_attribute(Interpreter& in, const Value& obj, const std::string& name);
Value get_item(Interpreter& in, const Value& obj, const Value& key);
// Python obj[start:stop:step] on str, list, tuple (None = omitted).
Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step);

// A bound method (`"abc".upper`, `d.get`), or an Undefined when `obj` has no such method.
Value method_of(Interpreter& in, const Value& obj, const std::string& name);

}  // namespace attnres::jinja
