// Renders a parsed Jinja template. One Interpreter per render call: all mutable state
// (scopes, output buffers, counters) lives here, never in the shared template tree.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/jinja/jinja_ast.h"
#include "engine/jinja/jinja_value.h"

namespace attnres::jinja {

// Hostile templates must fail with an Error, never exhaust memory, stack or time.
struct RenderLimits {
  size_t max_output_bytes = 16u << 20;      // also caps any single string value
  int max_call_depth = 64;                  // nested macro calls
  int64_t max_loop_iterations = 1'000'000;  // summed over all loops of one render
};

class Interpreter {
 public:
  Interpreter(const Template& tmpl, const RenderLimits& limits);

  // `context` entries become template variables (over the built-in globals).
  std::string render(const DictItems& context);

  // ---- used by filters, tests, methods -------------------------------------------------
  Value getattr(const Value& obj, const std::string& name);
  Value getitem(const Value& obj, const Value& key);
  Value call(const Value& fn, CallArgs& args);
  Value filter(const std::string& name, const Value& subject, CallArgs& args);
  bool test(const std::string& name, const Value& subject, CallArgs& args);
  // Throws when a string or list being built would exceed the output limit.
  void check_size(size_t bytes) const;
  void count_iterations(int64_t n);
  const RenderLimits& limits() const { return limits_; }

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  struct Frame {
    std::unordered_map<std::string, Value> vars;
    int parent;  // index into frames_, -1 for the root
  };

  Flow exec_body(const Body& body);
  Flow exec(const Stmt& s);
  void exec_for(const Stmt& s);
  void exec_if(const Stmt& s, Flow& flow);
  std::string render_body_to_string(const Body& body);
  void assign(const Expr& target, const Value& value);
  Value make_macro(const Stmt& s);
  void write(const std::string& text);

  Value eval(const Expr& e);
  Value eval_binary(const Expr& e);
  Value eval_compare(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_filter(const Expr& e);
  Value eval_slice(const Expr& e);
  void eval_args(const Expr& e, size_t first_arg, CallArgs& out);

  Value lookup(const std::string& name) const;
  void set_var(const std::string& name, const Value& value);
  void push_frame(int parent);
  void pop_frame();

  const Template& tmpl_;
  RenderLimits limits_;
  std::vector<Frame> frames_;
  int current_ = -1;
  std::string* out_ = nullptr;
  int call_depth_ = 0;
  int64_t iterations_ = 0;
  std::vector<Value> block_values_;  // stack for {% filter %} / {% set x | f %} bodies
  // Namespaces given an attribute during this render. `{% set ns.a = ns %}` (or two namespaces
  // holding each other) is a reference cycle that shared ownership never frees; render()
  // empties these when it ends, which breaks every cycle (each needs such an assignment).
  std::vector<Value> assigned_namespaces_;
  std::unordered_set<const DictItems*> assigned_namespace_ids_;
};

// Python-semantics helpers shared by the interpreter and the builtins.
Value binary_op(Interpreter& in, const std::string& op, const Value& l, const Value& r);
bool compare_op(const std::string& op, const Value& l, const Value& r);
bool contains(const Value& container, const Value& item);
// Python's `a < b` for the orderable types; throws TypeError-like Error otherwise.
bool less_than(const Value& a, const Value& b);
// Python iter(): items of a list, keys of a dict, characters of a string; Undefined is empty.
ValueList iterate(const Value& v);
[[noreturn]] void undefined_error(const Value& undefined);

}  // namespace attnres::jinja
